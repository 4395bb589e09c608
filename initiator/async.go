package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
)

// Asynchronous reads and writes: the NBD front end starts each request
// from the goroutine that reads it off the client's connection and is told
// the outcome by a callback, so a request costs no goroutine of its own
// and no hand-off to wake one: the command goes out from the reader, the
// answer is handled by the QP's poller, which completes the request on the
// spot. Whatever cannot take this path at once (no live session, no free
// slot or staging buffer, a request larger than one transfer, a write
// while a Flush waits) runs the blocking path in a goroutine instead, and
// so does a request whose connection was lost in flight: ReadAt and
// WriteAt then wait for the reconnect and replay it.

// asyncReq is a request started by StartRead or StartWrite.
type asyncReq struct {
	c     *Client
	ctx   context.Context
	op    blockproto.Opcode
	p     []byte
	off   int64
	fua   bool
	token uint64
	done  func(error)
	// barrier: the request holds c.barrier shared (a write), released
	// when it completes.
	barrier bool
}

// StartRead starts filling p with the bytes at off (as ReadAt) and calls
// done with the outcome exactly once: possibly before StartRead returns,
// else from a goroutine of the client's, which done must not block. p must
// not be used until then. ctx bounds the request only when it takes the
// blocking path.
func (c *Client) StartRead(ctx context.Context, p []byte, off int64, done func(error)) {
	if err := c.check(off, int64(len(p))); err != nil {
		done(err)
		return
	}
	a := asyncReq{c: c, ctx: ctx, op: blockproto.OpRead, p: p, off: off, done: done}
	if !c.startAsync(&a) {
		go a.block()
	}
}

// StartWrite starts writing p at off (as WriteAt, with the fence token
// set by SetFence) and calls done with the outcome, as StartRead does. p
// must not be changed until then.
func (c *Client) StartWrite(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	if err := c.check(off, int64(len(p))); err != nil {
		done(err)
		return
	}
	if c.readOnly {
		done(fmt.Errorf("%w: %s", ErrReadOnly, c.cfg.Volume))
		return
	}
	a := asyncReq{c: c, ctx: ctx, op: blockproto.OpWrite, p: p, off: off, fua: fua, token: c.fence.Load(), done: done}
	// Held shared until the write completes, so a Flush waits for it;
	// while a Flush waits, new writes take the blocking path behind it.
	if !c.barrier.TryRLock() {
		go a.block()
		return
	}
	a.barrier = true
	if !c.startAsync(&a) {
		c.barrier.RUnlock()
		a.barrier = false
		go a.block()
	}
}

// Plug holds back the commands started from now on until the returned
// function is called, so that a burst of them leaves in one write per QP
// (rnic.QP.Plug). Call it before waiting for anything.
func (c *Client) Plug() (unplug func()) {
	s := c.live()
	if s == nil {
		return func() {}
	}
	for _, q := range s.qps {
		q.qp.Plug()
	}
	return func() {
		for _, q := range s.qps {
			q.qp.Unplug()
		}
	}
}

// live returns the current session if there is one and it is alive,
// without waiting.
func (c *Client) live() *session {
	c.mu.Lock()
	s, ok := c.sess, !c.closed && c.fatal == nil
	c.mu.Unlock()
	if !ok || s == nil || s.isDead() {
		return nil
	}
	return s
}

// startAsync starts a on a free slot of the live session if it can do so
// without waiting; it reports whether it did.
func (c *Client) startAsync(a *asyncReq) bool {
	s := c.live()
	if s == nil || len(a.p) == 0 || len(a.p) > s.maxTransfer {
		return false
	}
	q := s.pick(len(a.p))
	var i int
	select {
	case i = <-q.free:
	default:
		return false
	}
	// A staging buffer for the RDMA Write or Read; an inline READ's data
	// comes in the target's Send and goes straight to p (onData).
	var b *bbuf
	if a.op != blockproto.OpRead || uint32(len(a.p)) > q.inline {
		if b = s.bounce.tryGet(len(a.p)); b == nil {
			q.free <- i
			return false
		}
	}
	if a.op == blockproto.OpWrite {
		copy(b.b, a.p)
	}
	var flags uint16
	if a.fua {
		flags = blockproto.FlagFUA
	}
	sl := &q.slots[i]
	sl.op, sl.flags, sl.off, sl.n, sl.token, sl.bounce = a.op, flags, uint64(a.off), uint32(len(a.p)), a.token, b
	sl.async, sl.areq = true, *a
	if err := sl.start(); err != nil { // the QP died; start freed the slot
		sl.async, sl.areq, sl.bounce = false, asyncReq{}, nil
		s.bounce.put(b)
		return false
	}
	return true
}

// completeAsync ends an exchange started by startAsync (from finish).
func (sl *islot) completeAsync() {
	q := sl.q
	a := sl.areq
	sl.async, sl.areq = false, asyncReq{}
	_, err := sl.collect()
	b := sl.bounce
	sl.bounce = nil
	if err == nil && a.op == blockproto.OpRead && b != nil {
		copy(a.p, b.b[:sl.n])
	}
	sl.state.Store(slotIdle)
	q.free <- sl.idx
	q.s.bounce.put(b)
	if a.barrier {
		a.c.barrier.RUnlock()
		a.barrier = false
	}
	if errors.Is(err, errConnLost) {
		go a.block() // replayed once a session is back
		return
	}
	a.done(err)
}

// block runs a on the blocking path and reports its outcome.
func (a asyncReq) block() {
	var err error
	switch a.op {
	case blockproto.OpRead:
		err = a.c.ReadAt(a.ctx, a.p, a.off)
	case blockproto.OpWrite:
		err = a.c.WriteAtToken(a.ctx, a.p, a.off, a.fua, a.token)
	}
	a.done(err)
}
