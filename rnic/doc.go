// Package rnic is a software RNIC: RDMAP (RFC 5040) with the RFC 7306
// extensions over DDP (RFC 5041) over MPA (RFC 5044, RFC 6581) over TCP,
// behind the verbs of draft-hilland-rddp-verbs.
//
// # Resources
//
// Open returns a Device. A Device owns protection domains (PD), completion
// queues (CQ), shared receive queues (SRQ), queue pairs (QP), memory regions
// (MR) and memory windows (MW). Memory regions are registered over Go byte
// slices (or page lists of them) and named by STags: a random 24-bit index
// and an 8-bit key (stag.go). A QP moves from Idle to RTS when a stream is
// attached to it: Device.Connect / Listener.Accept run the MPA exchange
// (cm.go) and attach it.
//
// # Where things happen
//
//   - wire formats: packages mpa, ddp, rdmap (decoders return *term.Error
//     carrying the Terminate code);
//   - STag checks: stag.go (remoteAccess for inbound tagged access,
//     localAccess for SGEs), mw.go (bind, invalidate), mr.go (registration);
//   - receive path: rx.go (one goroutine per stream: parse, check, place,
//     complete; a consumer blocked in CQ.Wait may run it instead: drive.go);
//     transmit path: tx.go (one goroutine per stream: SQ WQEs and
//     responses into batched FPDUs); stream lifecycle and the QP state
//     machine's automatic transitions: conn.go; verbs-level transitions:
//     qp.go; completions: cq.go, sq.go.
//
// # Concurrency
//
// Every verb is safe for concurrent use. Completion and asynchronous event
// handlers run on one dispatcher goroutine per device, in order, outside all
// engine locks. Two extensions let the consumer's goroutines run the
// engine's receive: a direct handler (CQ.SetDirectHandler) runs on the
// receive goroutine at the end of each batch, and CQ.Wait runs the receive
// of the stream it waits for itself (drive.go; Config.NoWaitDrive turns
// that off). Buffers named by posted work requests belong to the RNIC
// until their completion is polled: the CQ's lock orders the engine's writes
// before the consumer's reads. A third extension tells how far the
// transmitter got without a completion: PostSendMarked records where a list
// of WRs was queued and SendGathered reports whether one was gathered: its
// bytes, and those of every WR before it, were read from memory and none
// of them is read again (a consumer checks a peer's answer against it;
// unsignaled WRs stay unsignaled).
//
// # Design notes
//
// Placement before CRC: an inbound segment's payload is copied into the
// target buffer and checksummed in one pass, or read into it straight from
// the socket and checksummed there (large payloads); the CRC is verified at
// the end of the segment. Every check on the headers passes before a byte is placed,
// so a corrupt segment can only write bytes inside a buffer the peer was
// allowed to write; its operation then never completes and the stream is
// terminated. This is the behaviour of hardware RNICs and of Linux siw.
package rnic
