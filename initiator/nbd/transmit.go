package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// request is one transmission request on its way from the reader to the
// backend and back out as a reply. Requests are recycled.
type request struct {
	t          *transmission
	typ, flags uint16
	cookie     uint64
	off        uint64
	length     uint32
	buf        *[]byte // WRITE payload or READ data; nil otherwise
	reserved   int64   // bytes held in the payload budget
	errno      uint32
	// ext is a BLOCK_STATUS reply's descriptors (encoded; kept for reuse).
	ext []byte
	// hdr[:hdrLen] is the reply header (simple, or a structured chunk's
	// header and fixed payload), encoded when queued.
	hdr    [StructuredReplySize + 8]byte
	hdrLen int
}

// Complete ends r with the backend's outcome and queues its reply; the
// returned Flusher (the transmission) writes it. It is r's Completion for
// an AsyncBackend.
func (r *request) Complete(err error) Flusher {
	r.t.finish(r, err)
	r.t.queue(r)
	return r.t
}

// transmission is the transmission phase of one connection.
type transmission struct {
	c   *conn
	sel selected
	// ctx is the context of the connection's Backend calls: the server's,
	// also cancelled (abandon) when the client leaves without
	// NBD_CMD_DISC.
	ctx     context.Context
	abandon context.CancelCauseFunc
	// disc: the reader stopped at NBD_CMD_DISC.
	disc bool
	// discAhead: the client shut its side down after NBD_CMD_DISC, which
	// the reader has yet to reach (reader only; see waitWatched).
	discAhead bool

	slots  chan struct{} // one per request in flight
	budget *budget
	wg     sync.WaitGroup // requests read and not yet replied to

	async   AsyncBackend // the export's backend, if it is one
	plugger Plugger      // likewise
	unplug  Unplugger    // set while the backend is plugged (reader only)
	losses  LossCounter  // likewise
	// dirtyLoss is 0 when no write was acknowledged to the client since
	// its last FLUSH, else 1 + losses.WriteLosses() as of the first one
	// (see flush).
	dirtyLoss atomic.Uint64

	replies replyWriter

	fmu  sync.Mutex
	free []*request // recycled requests
}

// transmit serves requests until the client disconnects, violates the
// protocol, or ctx is cancelled.
func (c *conn) transmit(ctx context.Context, sel selected) error {
	t := &transmission{
		c:      c,
		sel:    sel,
		slots:  make(chan struct{}, c.cfg.maxInFlight),
		budget: newBudget(c.cfg.maxInFlightBytes),
	}
	t.ctx, t.abandon = context.WithCancelCause(ctx)
	defer t.abandon(nil)
	t.async, _ = sel.exp.Backend.(AsyncBackend)
	t.plugger, _ = sel.exp.Backend.(Plugger)
	t.losses, _ = sel.exp.Backend.(LossCounter)
	t.replies.init(t)

	readErr := t.reader()
	t.endPlug()
	c.log.Debug("nbd: reader stopped", "err", readErr)
	if !t.disc && ctx.Err() == nil {
		// The client left without NBD_CMD_DISC (it closed or reset the
		// connection, timed out, or broke the protocol): no reply will
		// reach it. A request still waiting for the Backend (a write
		// waiting for a lost session to come back, to be replayed) must
		// not run later: the client was told nothing, may have written
		// the same blocks since over another connection, and a replay
		// then would put the older data back over them.
		if n := len(t.slots); n > 0 {
			c.log.Info(abandonedMsg, "in_flight", n)
		}
		t.abandon(ErrClientGone)
	}

	// Every request read gets a reply; wait until they are written, within
	// bounds.
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.drainTimeout))
	t.wg.Wait()
	writeErr := t.replies.close()

	switch {
	case readErr == nil && writeErr == nil:
		return nil
	case errors.Is(readErr, ErrProtocol):
		return readErr
	case writeErr != nil && ctx.Err() == nil:
		return writeErr
	case ctx.Err() != nil:
		return nil
	}
	return readErr
}

// abandonedMsg is the log message of a client that left with requests in
// flight.
const abandonedMsg = "nbd: the client left without NBD_CMD_DISC; its requests in flight are abandoned: " +
	"those still waiting for the target will not run"

// newRequest returns a recycled request (or a new one).
func (t *transmission) newRequest() *request {
	t.fmu.Lock()
	var r *request
	if n := len(t.free); n > 0 {
		r = t.free[n-1]
		t.free = t.free[:n-1]
	}
	t.fmu.Unlock()
	if r == nil {
		r = &request{t: t}
	}
	return r
}

// reader takes requests off the socket and dispatches them. It returns
// nil on NBD_CMD_DISC, on the client closing the connection between
// requests, and on shutdown.
func (t *transmission) reader() error {
	c := t.c
	exp := t.sel.exp
	var hdr [RequestSize]byte
	for {
		t.mayWait(RequestSize)
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return t.readError(err, "request header")
		}
		h := Request(hdr[:])
		if m := h.Magic(); m != magicRequest {
			return fmt.Errorf("%w: request magic %#08x, want %#08x", ErrProtocol, m, magicRequest)
		}
		typ := h.Type()
		if typ == CmdDisc {
			c.log.Debug("nbd: NBD_CMD_DISC")
			t.disc = true
			return nil
		}
		r := t.newRequest()
		r.typ, r.flags, r.cookie, r.off, r.length, r.errno = typ, h.Flags(), h.Cookie(), h.Offset(), h.Length(), 0
		r.errno = check(t.sel, r)

		if r.typ == CmdWrite {
			if r.length > max(exp.MaxBlock, interopPayload) {
				return fmt.Errorf("%w: NBD_CMD_WRITE payload of %d bytes exceeds the maximum %d", ErrProtocol, r.length, exp.MaxBlock)
			}
			if err := t.takeSlot(int64(r.length)); err != nil {
				return nil
			}
			if r.errno != 0 || r.length == 0 {
				// Refused writes still carry their payload: skip it. A
				// write of nothing succeeds without reaching the
				// Backend.
				t.mayWait(int(r.length))
				if _, err := io.CopyN(io.Discard, c.br, int64(r.length)); err != nil {
					t.done(r)
					return t.readError(err, "write payload")
				}
				t.reply(r)
				continue
			}
			if err := t.acquire(int64(r.length), int64(r.length)); err != nil {
				t.done(r)
				return nil
			}
			r.reserved = int64(r.length)
			r.buf = c.pool.get(int(r.length))
			t.mayWait(int(r.length))
			if _, err := io.ReadFull(c.br, *r.buf); err != nil {
				t.done(r)
				return t.readError(err, "write payload")
			}
			t.dispatch(r)
			continue
		}

		if err := t.takeSlot(0); err != nil {
			return nil
		}
		if r.errno != 0 || r.length == 0 && r.typ != CmdFlush {
			t.reply(r) // an error, or nothing to do
			continue
		}
		if r.typ == CmdRead {
			if err := t.acquire(int64(r.length), 0); err != nil {
				t.done(r)
				return nil
			}
			r.reserved = int64(r.length)
			r.buf = c.pool.get(int(r.length))
		}
		t.dispatch(r)
	}
}

// readError classifies an error reading from the client.
func (t *transmission) readError(err error, what string) error {
	if t.ctx.Err() != nil {
		return nil // shutdown
	}
	if errors.Is(err, io.EOF) && what == "request header" {
		t.c.log.Debug("nbd: client closed the connection without NBD_CMD_DISC")
		return nil
	}
	if errors.Is(err, net.ErrClosed) {
		return nil // a reply write failed and closed the connection
	}
	return fmt.Errorf("nbd: read %s: %w", what, err)
}

// takeSlot waits for room for one more request in flight. skip is the
// payload of the current request still to be read (see waitWatched).
func (t *transmission) takeSlot(skip int64) error {
	select {
	case t.slots <- struct{}{}:
		return nil
	default:
	}
	t.endPlug() // what waits behind the plug may be what frees a slot
	t.c.log.Debug("nbd: waiting for a request slot", "max_in_flight", cap(t.slots))
	return t.waitWatched(skip, func(ctx context.Context) error {
		select {
		case t.slots <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// acquire takes n bytes of the payload budget, waiting if need be. skip
// is the payload of the current request still to be read (see
// waitWatched).
func (t *transmission) acquire(n, skip int64) error {
	if t.budget.tryAcquire(n) {
		return nil
	}
	t.endPlug()
	t.c.log.Debug("nbd: waiting for payload budget", "bytes", n)
	return t.waitWatched(skip, func(ctx context.Context) error { return t.budget.acquire(ctx, n) })
}

// mayWait ends the plug if reading n more bytes from the client may wait.
func (t *transmission) mayWait(n int) {
	if t.unplug != nil && t.c.br.Buffered() < n {
		t.endPlug()
	}
}

func (t *transmission) endPlug() {
	if t.unplug != nil {
		t.unplug.Unplug()
		t.unplug = nil
	}
}

// dispatch runs r on the backend: READ and WRITE of an AsyncBackend
// start from here and complete through r.Complete, the rest in a
// goroutine of their own.
func (t *transmission) dispatch(r *request) {
	t.wg.Add(1)
	if t.async != nil && (r.typ == CmdRead || r.typ == CmdWrite) {
		// Hold the request back until the reader has started every
		// request already read from the socket: they then leave
		// together, and the last one as soon as the reader would wait
		// (mayWait unplugs).
		if t.plugger != nil && t.unplug == nil {
			t.unplug = t.plugger.Plug()
		}
		if r.typ == CmdRead {
			t.async.StartRead(t.ctx, *r.buf, int64(r.off), r)
		} else {
			t.async.StartWrite(t.ctx, *r.buf, int64(r.off), r.flags&CmdFlagFUA != 0, r)
		}
		return
	}
	go func() {
		t.execute(r)
		t.queue(r)
		t.replies.Flush()
	}()
}

// reply answers r at once (a refusal, or nothing to do).
func (t *transmission) reply(r *request) {
	t.wg.Add(1)
	t.queue(r)
	t.replies.Flush()
}

// queue hands r's reply to the writer.
func (t *transmission) queue(r *request) { t.replies.add(r) }

// Flush writes the replies queued so far (the Flusher of every request's
// Completion).
func (t *transmission) Flush() { t.replies.Flush() }

// done releases what r holds and recycles it, after its reply was sent or
// abandoned.
func (t *transmission) done(r *request) {
	if r.buf != nil {
		t.c.pool.put(r.buf)
		r.buf = nil
	}
	t.budget.release(r.reserved)
	r.reserved = 0
	<-t.slots
	t.fmu.Lock()
	t.free = append(t.free, r)
	t.fmu.Unlock()
}
