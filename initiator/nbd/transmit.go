package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// request is one transmission request on its way from the reader through
// a worker to the writer.
type request struct {
	typ, flags uint16
	cookie     uint64
	off        uint64
	length     uint32
	buf        *[]byte // WRITE payload or READ data; nil otherwise
	reserved   int64   // bytes held in the payload budget
	errno      uint32
}

// session is the transmission phase of one connection.
type session struct {
	c       *conn
	sel     selected
	ctx     context.Context
	slots   chan struct{} // one per request in flight
	budget  *budget
	replies chan *request // to the writer; capacity = slots, never blocks
	wg      sync.WaitGroup

	async   AsyncBackend // the export's backend, if it is one
	plugger Plugger      // likewise
	unplug  func()       // set while the backend is plugged (reader only)
}

// transmit serves requests until the client disconnects, violates the
// protocol, or ctx is cancelled.
func (c *conn) transmit(ctx context.Context, sel selected) error {
	s := &session{
		c:       c,
		sel:     sel,
		ctx:     ctx,
		slots:   make(chan struct{}, c.cfg.maxInFlight),
		budget:  newBudget(c.cfg.maxInFlightBytes),
		replies: make(chan *request, c.cfg.maxInFlight),
	}
	s.async, _ = sel.exp.Backend.(AsyncBackend)
	s.plugger, _ = sel.exp.Backend.(Plugger)
	writerDone := make(chan error, 1)
	go func() { writerDone <- s.writer() }()

	readErr := s.reader()
	s.endPlug()

	// Every request read has a worker or an immediate reply; wait for the
	// workers, then let the writer send what is left, within bounds.
	s.wg.Wait()
	close(s.replies)
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.drainTimeout))
	writeErr := <-writerDone

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

// reader takes requests off the socket and dispatches them. It returns
// nil on NBD_CMD_DISC, on the client closing the connection between
// requests, and on shutdown.
func (s *session) reader() error {
	c := s.c
	exp := s.sel.exp
	var hdr [RequestSize]byte
	for {
		s.mayWait(RequestSize)
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return s.readError(err, "request header")
		}
		h := Request(hdr[:])
		if m := h.Magic(); m != magicRequest {
			return fmt.Errorf("%w: request magic %#08x, want %#08x", ErrProtocol, m, magicRequest)
		}
		r := &request{typ: h.Type(), flags: h.Flags(), cookie: h.Cookie(), off: h.Offset(), length: h.Length()}
		if r.typ == CmdDisc {
			c.log.Debug("nbd: NBD_CMD_DISC")
			return nil
		}
		r.errno = check(exp, s.sel.size, r)

		if r.typ == CmdWrite {
			if r.length > max(exp.MaxBlock, interopPayload) {
				return fmt.Errorf("%w: NBD_CMD_WRITE payload of %d bytes exceeds the maximum %d", ErrProtocol, r.length, exp.MaxBlock)
			}
			if err := s.takeSlot(); err != nil {
				return nil
			}
			if r.errno != 0 {
				// Refused writes still carry their payload: skip it.
				if _, err := io.CopyN(io.Discard, c.br, int64(r.length)); err != nil {
					s.done(r)
					return s.readError(err, "write payload")
				}
				s.reply(r)
				continue
			}
			if err := s.acquire(int64(r.length)); err != nil {
				s.done(r)
				return nil
			}
			r.reserved = int64(r.length)
			r.buf = c.pool.get(int(r.length))
			s.mayWait(int(r.length))
			if _, err := io.ReadFull(c.br, *r.buf); err != nil {
				s.done(r)
				return s.readError(err, "write payload")
			}
			s.dispatch(r)
			continue
		}

		if err := s.takeSlot(); err != nil {
			return nil
		}
		if r.errno != 0 || r.length == 0 && r.typ != CmdFlush {
			s.reply(r) // an error, or nothing to do
			continue
		}
		if r.typ == CmdRead {
			if err := s.acquire(int64(r.length)); err != nil {
				s.done(r)
				return nil
			}
			r.reserved = int64(r.length)
			r.buf = c.pool.get(int(r.length))
		}
		s.dispatch(r)
	}
}

// readError classifies an error reading from the client.
func (s *session) readError(err error, what string) error {
	if s.ctx.Err() != nil {
		return nil // shutdown
	}
	if errors.Is(err, io.EOF) && what == "request header" {
		s.c.log.Debug("nbd: client closed the connection without NBD_CMD_DISC")
		return nil
	}
	if errors.Is(err, net.ErrClosed) {
		return nil // the writer failed and closed the connection
	}
	return fmt.Errorf("nbd: read %s: %w", what, err)
}

// takeSlot waits for room for one more request in flight.
func (s *session) takeSlot() error {
	select {
	case s.slots <- struct{}{}:
		return nil
	default:
	}
	s.endPlug() // what waits behind the plug may be what frees a slot
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// acquire takes n bytes of the payload budget, waiting if need be.
func (s *session) acquire(n int64) error {
	if s.budget.tryAcquire(n) {
		return nil
	}
	s.endPlug()
	return s.budget.acquire(s.ctx, n)
}

// mayWait ends the plug if reading n more bytes from the client may wait.
func (s *session) mayWait(n int) {
	if s.unplug != nil && s.c.br.Buffered() < n {
		s.endPlug()
	}
}

func (s *session) endPlug() {
	if s.unplug != nil {
		s.unplug()
		s.unplug = nil
	}
}

// dispatch runs r on the backend: READ and WRITE of an AsyncBackend
// start from here and complete in done, the rest in a goroutine of
// their own.
func (s *session) dispatch(r *request) {
	s.wg.Add(1)
	if s.async != nil && (r.typ == CmdRead || r.typ == CmdWrite) {
		// Another request already waits in the buffer: hold this one
		// back until it, and whatever follows it there, can go along.
		if s.plugger != nil && s.unplug == nil && s.c.br.Buffered() >= RequestSize {
			s.unplug = s.plugger.Plug()
		}
		done := func(err error) {
			s.finish(r, err)
			s.reply(r)
			s.wg.Done()
		}
		if r.typ == CmdRead {
			s.async.StartRead(s.ctx, *r.buf, int64(r.off), done)
		} else {
			s.async.StartWrite(s.ctx, *r.buf, int64(r.off), r.flags&CmdFlagFUA != 0, done)
		}
		return
	}
	go func() {
		defer s.wg.Done()
		s.execute(r)
		s.reply(r)
	}()
}

// reply queues r for the writer. It never blocks: the channel has a place
// for every slot.
func (s *session) reply(r *request) { s.replies <- r }

// done releases what r holds, after its reply was sent or abandoned.
func (s *session) done(r *request) {
	if r.buf != nil {
		s.c.pool.put(r.buf)
		r.buf = nil
	}
	s.budget.release(r.reserved)
	r.reserved = 0
	<-s.slots
}

// writer sends replies in the order they complete and returns the first
// write error. After an error it closes the connection, which stops the
// reader, and keeps draining the queue so that resources are released.
func (s *session) writer() error {
	c := s.c
	var werr error
	for r := range s.replies {
		if werr == nil {
			werr = s.writeReply(r)
			if werr == nil && len(s.replies) == 0 {
				// Yield once before the write: requests completed by the
				// same batch of completions queue their replies meanwhile
				// and share it (a loopback write costs several µs).
				runtime.Gosched()
				if len(s.replies) == 0 {
					werr = c.bw.Flush()
				}
			}
			if werr != nil {
				werr = fmt.Errorf("nbd: send reply: %w", werr)
				c.nc.Close()
			}
		}
		s.done(r)
	}
	if werr == nil {
		if err := c.bw.Flush(); err != nil {
			werr = fmt.Errorf("nbd: send reply: %w", err)
		}
	}
	return werr
}

// writeReply buffers the simple reply for r, with the data of a
// successful read.
func (s *session) writeReply(r *request) error {
	var h [SimpleReplySize]byte
	SimpleReply(h[:]).Encode(protocol.TransmissionReplyHeader{
		ReplyMagic: magicSimpleReply, Error: r.errno, Handle: r.cookie,
	})
	if _, err := s.c.bw.Write(h[:]); err != nil {
		return err
	}
	if r.typ == CmdRead && r.errno == 0 && r.buf != nil {
		if _, err := s.c.bw.Write(*r.buf); err != nil {
			return err
		}
	}
	return nil
}
