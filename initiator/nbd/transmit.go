package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	writerDone := make(chan error, 1)
	go func() { writerDone <- s.writer() }()

	readErr := s.reader()

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
			if err := s.budget.acquire(s.ctx, int64(r.length)); err != nil {
				s.done(r)
				return nil
			}
			r.reserved = int64(r.length)
			r.buf = c.pool.get(int(r.length))
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
			if err := s.budget.acquire(s.ctx, int64(r.length)); err != nil {
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
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// dispatch runs r on the backend in its own goroutine.
func (s *session) dispatch(r *request) {
	s.wg.Add(1)
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
				werr = c.bw.Flush()
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
