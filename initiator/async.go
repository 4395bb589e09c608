package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
)

// Asynchronous reads and writes: the NBD front end starts each request
// from the goroutine that reads it off the client's connection and is told
// the outcome through its Completion, so a request costs no goroutine of
// its own and no hand-off to wake one: the command goes out from the
// reader, the answer is handled by the QP's completion handler, which
// completes the request on the spot, and the replies of one batch of
// completions leave together when the handler flushes the Completions'
// Flushers. The caller's buffer is the RDMA source or sink itself
// (Fast-Registered for the transfer and invalidated after it): no staging
// copy. Whatever cannot take this path at once (no live session, no free
// slot, a request larger than one transfer, a write while a Flush waits)
// runs the blocking path in a goroutine instead, and so does a request
// whose connection was lost in flight: ReadAt and WriteAt then wait for
// the reconnect and replay it.

// Completion receives the outcome of a request started with StartRead or
// StartWrite. Complete is called exactly once, possibly before the Start
// call returns, else from a goroutine of the client's; it must not block.
// It may return a Flusher (nil: none): the client calls its Flush once the
// burst of completions it is delivering has ended (once per distinct
// Flusher), or right away when it delivers no burst, so the completer can
// act on a whole burst at once (one write of all its replies).
//
// An alias of an interface literal, so that a package defining the same
// alias (initiator/nbd does) names the identical type.
type Completion = interface {
	Complete(err error) Flusher
}

// Flusher is what a Completion returns to be flushed after a burst.
type Flusher = interface{ Flush() }

// asyncReq is a request started by StartRead or StartWrite.
type asyncReq struct {
	c     *Client
	ctx   context.Context
	op    blockproto.Opcode
	p     []byte
	off   int64
	fua   bool
	token uint64
	cpl   Completion
	// barrier: the request holds c.barrier shared (a write), released
	// when it completes.
	barrier bool
}

// StartRead starts filling p with the bytes at off (as ReadAt) and reports
// the outcome to cpl. p must not be used until then. ctx bounds the
// request only when it takes the blocking path.
func (c *Client) StartRead(ctx context.Context, p []byte, off int64, cpl Completion) {
	if err := c.check(off, int64(len(p))); err != nil {
		complete(cpl, err)
		return
	}
	a := asyncReq{c: c, ctx: ctx, op: blockproto.OpRead, p: p, off: off, cpl: cpl}
	if !c.startAsync(&a) {
		go a.block()
	}
}

// StartWrite starts writing p at off (as WriteAt, with the fence token
// set by SetFence) and reports the outcome to cpl, as StartRead does. p
// must not be changed until then.
func (c *Client) StartWrite(ctx context.Context, p []byte, off int64, fua bool, cpl Completion) {
	if err := c.check(off, int64(len(p))); err != nil {
		complete(cpl, err)
		return
	}
	if c.readOnly {
		complete(cpl, fmt.Errorf("%w: %s", ErrReadOnly, c.cfg.Volume))
		return
	}
	a := asyncReq{c: c, ctx: ctx, op: blockproto.OpWrite, p: p, off: off, fua: fua, token: c.fence.Load(), cpl: cpl}
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

// complete reports err to cpl outside a burst: its Flusher is flushed at
// once.
func complete(cpl Completion, err error) {
	if f := cpl.Complete(err); f != nil {
		f.Flush()
	}
}

// Unplugger ends a Plug.
type Unplugger = interface{ Unplug() }

// Plug holds back the commands started from now on until Unplug is called
// on what it returns, so that a burst of them leaves in one write per QP
// (rnic.QP.Plug). Call Unplug before waiting for anything.
func (c *Client) Plug() Unplugger {
	s := c.live()
	if s == nil {
		return noPlug{}
	}
	for _, q := range s.qps {
		q.QP.Plug()
	}
	return s
}

type noPlug struct{}

func (noPlug) Unplug() {}

// Unplug ends a Plug of the session's QPs.
func (s *session) Unplug() {
	for _, q := range s.qps {
		q.QP.Unplug()
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
	sl := s.pick(len(a.p)).tryAcquire()
	if sl == nil {
		return false
	}
	var flags uint16
	if a.fua {
		flags = blockproto.FlagFUA
	}
	sl.op, sl.flags, sl.off, sl.n, sl.token, sl.p = a.op, flags, uint64(a.off), uint32(len(a.p)), a.token, a.p
	sl.async, sl.areq = true, *a
	if err := sl.start(); err != nil { // the QP died; start freed the slot, which is no longer ours
		return false
	}
	return true
}

// completeAsync ends an exchange started by startAsync, from finish
// (fromFinish: in the handler, or in stop), or from start when it finished
// while start ran: the slot is free again before the Completion runs.
func (sl *slot) completeAsync(fromFinish bool) {
	q := sl.q
	a := sl.areq
	sl.async, sl.areq, sl.p = false, asyncReq{}, nil
	_, err := sl.collect()
	sl.state.Store(slotIdle)
	q.free <- sl.idx
	if a.barrier {
		a.c.barrier.RUnlock()
		a.barrier = false
	}
	if errors.Is(err, errConnLost) {
		go a.block() // replayed once a session is back
		return
	}
	if f := a.cpl.Complete(err); f != nil {
		if fromFinish && q.handling {
			q.addFlusher(f)
		} else {
			f.Flush()
		}
	}
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
	complete(a.cpl, err)
}

// CompletionFunc adapts a function to a Completion without a Flusher.
type CompletionFunc func(err error)

// Complete calls f.
func (f CompletionFunc) Complete(err error) Flusher {
	f(err)
	return nil
}
