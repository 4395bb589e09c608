// Package nbd is the NBD (Network Block Device) server through which
// `rinit nbd` exports a remote volume to ordinary NBD clients: the Linux
// kernel's nbd-client, qemu, libnbd's nbdinfo, nbdcopy and nbdfuse, fio's
// nbd engine. A Server offers Exports; each Export is a Backend (byte
// addressed ReadAt, WriteAt with FUA, Flush, Trim, WriteZeroes) plus how it
// is advertised. Serve takes a TCP or unix listener, ServeConn one
// connection.
//
// # What comes from go-nbd
//
// The protocol vocabulary: the magic numbers, option, reply and
// information type codes, flags and error values of
// github.com/pojntfx/go-nbd/pkg/protocol are used wherever it defines them
// (consts.go adds the ones it lacks, named as in the specification), and
// its header structs (NegotiationNewstyleHeader, NegotiationOptionHeader,
// NegotiationReplyHeader, NegotiationReplyInfo, NegotiationReplyBlockSize,
// TransmissionRequestHeader, TransmissionReplyHeader) are the field
// structs that this package's wire views (Greeting, Option, OptionReply,
// InfoExport, InfoBlockSize, Request, SimpleReply) encode from. The
// handshake and the whole transmission phase are this package's, and so
// are structured replies and metadata contexts (StructuredReply,
// MetaContextRequest), which go-nbd lacks.
//
// # Handshake
//
// Fixed newstyle only (the server also sets NBD_FLAG_NO_ZEROES). Options:
//
//   - NBD_OPT_GO, NBD_OPT_INFO: NBD_INFO_EXPORT (size, transmission
//     flags), NBD_INFO_BLOCK_SIZE (always sent), NBD_INFO_NAME (when asked
//     for, or when the default export was chosen by the empty name) and
//     NBD_INFO_DESCRIPTION (when asked for). Unknown export:
//     NBD_REP_ERR_UNKNOWN; bad lengths: NBD_REP_ERR_INVALID.
//   - NBD_OPT_EXPORT_NAME, with or without the 124 zero bytes; an unknown
//     export closes the connection, the only refusal that option allows.
//   - NBD_OPT_LIST: one NBD_REP_SERVER (name and description) per export.
//   - NBD_OPT_ABORT: acknowledged, then the connection is closed.
//   - NBD_OPT_STRUCTURED_REPLY: acknowledged; READ and BLOCK_STATUS are
//     then answered with structured replies (below).
//   - NBD_OPT_LIST_META_CONTEXT, NBD_OPT_SET_META_CONTEXT (after
//     NBD_OPT_STRUCTURED_REPLY, else NBD_REP_ERR_INVALID): the one context
//     is base:allocation (ID 1), offered for exports whose Backend is a
//     BlockStatuser. A listing matches it with no query, "base:" or its
//     name; a selection takes it when a query names it, for the export the
//     option names, and is used only if that export is the one chosen.
//   - everything else, including NBD_OPT_STARTTLS and
//     NBD_OPT_EXTENDED_HEADERS: NBD_REP_ERR_UNSUP.
//
// Option data over 64 KiB is skipped and answered with
// NBD_REP_ERR_TOO_BIG (an NBD_OPT_EXPORT_NAME that long closes the
// connection). Option haggling must finish within Server.HandshakeTimeout.
//
// Transmission flags: HAS_FLAGS always; SEND_FLUSH, SEND_FUA, SEND_TRIM
// and SEND_WRITE_ZEROES for writable exports; READ_ONLY for read-only
// ones; CAN_MULTI_CONN when Export.MultiConn says the Backend is
// consistent across connections.
//
// Size constraints (NBD_INFO_BLOCK_SIZE) default to minimum 512,
// preferred 4096, maximum payload 32 MiB. They are enforced on every
// request, also for clients that did not ask for them (the specification
// allows this if such requests are cleanly failed, which they are, with
// EINVAL); the Backend therefore only ever sees aligned ranges.
//
// # Transmission
//
// One reader goroutine per connection parses requests. READ and WRITE on
// an AsyncBackend start from the reader itself and complete through the
// request's Completion; every other request runs on the Backend in a
// goroutine of its own. Replies go out in the order requests complete, so
// they overtake each other freely: whoever completes requests queues
// their replies and flushes, and the first flusher writes everything
// queued in one writev (header and data gathered, no copy) without
// waiting; an AsyncBackend flushes once per burst of completions. What a
// slow client's socket does not take at once, the connection's writer
// goroutine finishes. At most Server.MaxInFlight requests (default 64) are
// in flight per connection, and their payloads (WRITE data held, READ data
// to send) are bounded by Server.MaxInFlightBytes (default 64 MiB): when
// either is used up the reader stops reading the socket until replies
// have gone out. Payload buffers are recycled in power-of-two size
// classes.
//
// Commands: READ, WRITE (FUA), FLUSH (which a LossCounter Backend also
// fails, once, for a client whose writes may be among those whose loss
// it reported to another connection's FLUSH), TRIM (FUA: trim then Flush),
// WRITE_ZEROES (FUA; with NO_HOLE the range is kept allocated: an
// AllocatedZeroer Backend's WriteZeroesAllocated, else zeroes written with
// WriteAt), CACHE (accepted as a no-op, not advertised), BLOCK_STATUS
// (with base:allocation selected; REQ_ONE honoured) and DISC.
//
// Replies are simple unless structured replies were negotiated; then a
// READ gets one chunk, NBD_REPLY_TYPE_OFFSET_DATA (or NONE for a length of
// 0, or ERROR), a BLOCK_STATUS one NBD_REPLY_TYPE_BLOCK_STATUS chunk of at
// most 512 descriptors (NBD_STATE_HOLE|NBD_STATE_ZERO for unallocated
// ranges, 0 for data) or ERROR, every chunk with NBD_REPLY_FLAG_DONE;
// other commands keep simple replies, which the specification allows for
// replies without payload. Every failure is answered on the request and
// the connection stays usable:
//
//   - EINVAL: unknown command (the specification's SHOULD; it reserves
//     ENOTSUP for fast-zero requests), BLOCK_STATUS without
//     base:allocation selected or of length 0, a flag not valid for the
//     command,
//     misalignment to the minimum block size, READ/WRITE longer than the
//     maximum payload, FLUSH with nonzero offset/length, READ, TRIM or
//     BLOCK_STATUS past the end;
//   - ENOSPC: WRITE/WRITE_ZEROES past the end, or a write the target's
//     store has no space for (a full thin pool);
//   - EPERM: WRITE, TRIM, WRITE_ZEROES on a read-only export;
//   - Backend errors: mapped by Errno (EIO unless the error says
//     otherwise; see Error).
//
// A protocol violation ends the connection with an Error-level log and an
// error wrapping ErrProtocol: a bad request magic, or a WRITE whose
// payload exceeds both the maximum payload and 32 MiB (payloads up to
// 32 MiB are skipped and refused with EINVAL, since the specification
// says they should not be treated as a denial of service). NBD_CMD_DISC
// stops the reader, lets the requests in flight finish and sends their
// replies, then closes. On shutdown (ctx cancelled) the same happens,
// except that Backend calls see the cancelled context and their errors
// go out as ESHUTDOWN; closing replies are bounded by Server.DrainTimeout.
//
// A client that leaves without NBD_CMD_DISC (closes or resets the
// connection, breaks the protocol) abandons its requests in flight: the
// context of their Backend calls is cancelled, with ErrClientGone as its
// cause, so a request that still waits (initiator: a write waiting for a
// lost session, to be replayed on the next) fails instead of running
// later, when the client, told nothing, may have written the same blocks
// again over another connection. This holds also while the reader waits
// for a request slot or payload budget and reads nothing: on Linux it
// watches the socket meanwhile (POLLRDHUP), and once the client has shut
// its side down it reads what remains and looks for NBD_CMD_DISC in it.
package nbd
