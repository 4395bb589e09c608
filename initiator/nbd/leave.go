package nbd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"syscall"
	"time"
)

// A client that leaves without NBD_CMD_DISC abandons its requests in
// flight (see transmit). The reader notices a departure when its read of
// the socket ends, but it does not read while it waits for a request slot
// (Server.MaxInFlight) or for payload budget (Server.MaxInFlightBytes):
// those waits end only when a request in flight completes, and one that
// waits in the Backend for a lost session to come back would then still
// run, late, over blocks the client may have written since through
// another connection. So these waits also watch the socket: when the
// client shuts its side down, everything it sent has arrived, and the
// reader reads it all and looks for NBD_CMD_DISC among it. Without one
// the client left: its requests are abandoned and the reader stops. With
// one it disconnected softly: the bytes are put back to be served as
// usual, and the wait goes on.

// errPeerShut is the cause of a watched wait's context when the client
// shut its side of the connection down.
var errPeerShut = errors.New("nbd: the client shut its side of the connection down")

// peerPoll is how long one poll of the socket by a watched wait lasts, in
// milliseconds: a watch ends at most this long after its wait.
const peerPoll = 50

// watchAfter is how long a wait for a slot or for budget goes unwatched.
// At a queue depth above MaxInFlight nearly every request waits for a
// slot, for about one I/O's time; a watch costs a descriptor and a thread
// blocked in poll for up to peerPoll, so only a wait that lasts (a
// session being re-established, a stalled target) is watched.
const watchAfter = 100 * time.Millisecond

// msgWatching is logged (debug) when a wait starts being watched.
const msgWatching = "nbd: the reader still waits for a slot or budget: watching the connection for the client leaving"

// waitWatched runs wait, the reader's wait for a slot or for budget: for
// watchAfter with t.ctx, then with a context that ends with t.ctx or when
// the client shuts its side of the connection down. skip is the payload
// of the current request the reader has still to read (a WRITE's), which
// precedes the next request. It returns nil once wait succeeded, else an
// error: t.ctx ended, or the client left without NBD_CMD_DISC
// (ErrClientGone). wait must take nothing when its context ends.
func (t *transmission) waitWatched(skip int64, wait func(ctx context.Context) error) error {
	if t.discAhead {
		return wait(t.ctx) // found before: the socket has nothing more to tell
	}
	short, cancel := context.WithTimeout(t.ctx, watchAfter)
	err := wait(short)
	cancel()
	if err == nil || t.ctx.Err() != nil {
		return err
	}
	t.c.log.Debug(msgWatching, "after", watchAfter)
	ctx, stop := t.watchPeer()
	err = wait(ctx)
	stop()
	if err == nil || t.ctx.Err() != nil || !errors.Is(context.Cause(ctx), errPeerShut) {
		return err
	}
	if t.clientLeft(skip) {
		// The reader stops, and transmit abandons the requests in
		// flight as for a client that left between requests.
		t.c.log.Debug("nbd: client shut the connection down without NBD_CMD_DISC while the reader waited")
		return ErrClientGone
	}
	// NBD_CMD_DISC is on its way to the reader: the requests before it
	// are served, and the socket has nothing more to tell (later waits
	// are not watched: they would only read the same bytes again).
	t.discAhead = true
	return wait(t.ctx)
}

// watchPeer returns a context that ends with t.ctx, or with cause
// errPeerShut when the client shuts its side of the connection down; stop
// ends the watch.
func (t *transmission) watchPeer() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(t.ctx)
	if sc, ok := t.c.nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			watchShut(raw, ctx.Done(), func() { cancel(errPeerShut) })
		}
	}
	return ctx, func() { cancel(nil) }
}

// clientLeft reports, once the client has shut its side of the
// connection down, whether it left without NBD_CMD_DISC. It reads what
// the client sent and the reader has not taken (all of it has arrived:
// it precedes the shutdown) and walks the requests in it, past skip
// bytes of the current request's payload: true unless one of them is
// NBD_CMD_DISC. A read error (a reset), a request cut short or a bad
// magic count as leaving: the reader could serve nothing after them. If
// the client disconnected softly, the bytes are put back in front of the
// reader.
func (t *transmission) clientLeft(skip int64) bool {
	rest, err := io.ReadAll(t.c.br)
	if err != nil {
		return true
	}
	if !discAhead(rest, skip) {
		return true
	}
	t.c.br = bufio.NewReaderSize(bytes.NewReader(rest), ioBufSize)
	return false
}

// discAhead reports whether the requests in b, after skip bytes, include
// NBD_CMD_DISC before they end or stop making sense.
func discAhead(b []byte, skip int64) bool {
	if skip > int64(len(b)) {
		return false
	}
	for p := b[skip:]; len(p) >= RequestSize; {
		h := Request(p)
		if h.Magic() != magicRequest {
			return false
		}
		if h.Type() == CmdDisc {
			return true
		}
		n := int64(RequestSize)
		if h.Type() == CmdWrite {
			n += int64(h.Length())
		}
		if n > int64(len(p)) {
			return false
		}
		p = p[n:]
	}
	return false
}
