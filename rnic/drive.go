package rnic

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/rnic/mpa"
)

// A waiter drives the receive (an extension of the verbs, like
// CQ.SetDirectHandler): CQ.Wait runs the receive loop of the stream it
// waits for itself, instead of being woken by the receive goroutine.
//
// Why: a goroutine woken by another (a channel send, a semaphore) is made
// runnable with a call that also wakes an idle P, another thread, when the
// process has one, and that thread's sleep and wake-up cost more than the
// round trip they serve (BenchmarkRead4K at GOMAXPROCS=2: 0.8 context
// switches per round trip). A goroutine the network poller finds ready is
// run by the thread that polled, with no other woken: that is how a TCP
// ping-pong's reader waits. So the waiter waits in the poller on the
// stream's socket, reads the Read Response (or whatever completes its work
// request) and places it, and returns with the completion in its own hands.
//
// The receive is a baton one goroutine holds at a time (driveState.baton): the
// receive goroutine (batonRecv), a waiter (batonWaiter), or nobody while it
// is lent (batonLent: the receive goroutine parked in lend, the socket
// unread). The parser and the receive state pass with it; the atomic
// transitions order every access to them.
//
//   - Recv -> Lent: the receive goroutine, at an FPDU boundary with nothing
//     buffered, finds the socket empty (one read that does not wait) while
//     a waiter asked for the receive (driveState.want): lend.
//   - Lent -> Waiter: CQ.Wait takes it (driveFor) and runs the loop until the CQ
//     holds a completion, its ctx ends, it is kicked, or the CQ no longer
//     qualifies (SetDirectHandler kicks it: the handlers are the receive
//     goroutine's to run); it pauses only at an FPDU boundary with nothing
//     buffered, never inside an MPA header (mpa.Reader.Idle).
//   - Waiter -> Lent: the waiter pauses (driveFor returns).
//   - Waiter -> Recv: the stream ended while the waiter drove: the end goes
//     to the receive goroutine, which ends the stream as always.
//   - Lent -> Recv: reclaim, when no waiter drove for lendFor (a timer), the
//     stream is being aborted, or the CQ no longer qualifies (a direct
//     handler set, another QP using it).
//
// Only a CQ that one attached stream uses alone, with no direct handler on
// either of the QP's CQs, is driven (CQ.drv). Completions that reach it
// from elsewhere while a waiter drives (the transmitter's, a flush) kick the
// waiter out of the poller: a read deadline in the past, which the loop
// does not take for an error (conn.read). So does the end of the waiter's
// ctx. A kick takes effect at the next FPDU boundary: a waiter whose peer
// stops in the middle of an FPDU waits for the rest, or for the stream to
// end (a QP being destroyed resets it).

const (
	batonRecv int32 = iota
	batonLent
	batonWaiter
)

// lendFor is how long the receive stays lent after its last waiter paused
// before the receive goroutine takes it back, so that a consumer calling
// Wait in a loop keeps it between calls. Inbound traffic nobody waits for
// sits in the socket meanwhile (up to about a millisecond when the process
// is idle: the network poller sleeps in whole milliseconds until a timer).
const lendFor = 200 * time.Microsecond

// driveState is a conn's part in the consumer-driven receive.
type driveState struct {
	baton atomic.Int32
	// want is the CQ of a waiter that asked for the receive while another
	// held it; whoever lends the receive next signals it.
	want atomic.Pointer[CQ]
	// handback wakes the receive goroutine parked in lend: one token per
	// transfer of the baton to it.
	handback chan struct{}
	// ended, end, endErr: the end of the stream a waiter met (written by
	// the waiter before it hands the baton back).
	ended  bool
	end    rxEnd
	endErr error

	timer    *time.Timer // reclaims a receive lent for lendFor (made in lend)
	armed    atomic.Bool
	t0       time.Time
	lastExit atomic.Int64 // when the last waiter paused, ns since t0

	// The ctx of the waiters: its end kicks the one driving. Kept across
	// Waits on the same ctx (its Done channel), so a loop of Waits
	// registers it once.
	watchDone <-chan struct{}
	watchStop func() bool

	// The read deadline: a kick sets one in the past (kicked); dlAt is
	// the one the stream asked for (a close's), restored after a kick.
	dlMu   sync.Mutex
	kicked bool
	dlAt   time.Time
	kicks  atomic.Uint64 // kicks made (tests read it)
}

// aLongTimeAgo is a read deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// setReadDeadline sets the stream's read deadline (closing, draining),
// which a kick in flight restores when it is over.
func (c *conn) setReadDeadline(t time.Time) {
	d := &c.drive
	d.dlMu.Lock()
	d.dlAt = t
	if !d.kicked {
		c.nc.SetReadDeadline(t)
	}
	d.dlMu.Unlock()
}

// kickWaiter makes the waiter driving the receive pause at its next FPDU
// boundary, out of the network poller if it waits there.
func (c *conn) kickWaiter() {
	d := &c.drive
	d.dlMu.Lock()
	if !d.kicked {
		d.kicked = true
		d.kicks.Add(1)
		c.nc.SetReadDeadline(aLongTimeAgo)
	}
	d.dlMu.Unlock()
}

// unkick reports whether a read that failed for its deadline was kicked,
// and then restores the deadline the stream asked for.
func (c *conn) unkick() bool {
	d := &c.drive
	d.dlMu.Lock()
	k := d.kicked
	if k {
		d.kicked = false
		c.nc.SetReadDeadline(d.dlAt)
	}
	d.dlMu.Unlock()
	return k
}

// read reads the socket for the receive loop, into a then b (with nowait,
// an error that is syscall.EAGAIN if nothing is there). A
// deadline a kick set is no error: the read goes on, except that a
// driving waiter pauses at an FPDU boundary (mpa.ErrWouldBlock).
func (c *conn) read(a, b []byte, nowait bool) (int, error) {
	for {
		var n int
		var err error
		if nowait {
			n, err = c.sr.TryReadVec(a, b)
		} else {
			n, err = c.sr.ReadVec(a, b)
		}
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.unkick() {
			return n, err
		}
		if c.rx.driver != nil && c.rd.Idle() {
			return 0, mpa.ErrWouldBlock
		}
	}
}

// readIdle is the receive loop's read at an FPDU boundary with nothing
// buffered: where the receive may pause. The driving waiter pauses there
// once its CQ holds a completion or its ctx ended; the receive goroutine
// pauses to lend the receive when a waiter asked for it and the socket has
// nothing now.
func (c *conn) readIdle(p []byte) (int, error) {
	r := &c.rx
	if cq := r.driver; cq != nil {
		// !drivable: a direct handler was set while this waiter drove;
		// the receive goroutine runs it (rxState.batchEnd kept what it
		// is owed), so the receive goes back to it.
		if cq.pending() || r.driveCtx.Err() != nil || !c.drivable() {
			return 0, mpa.ErrWouldBlock
		}
		return c.read(p, nil, false)
	}
	if c.drive.want.Load() != nil && c.drivable() {
		n, err := c.read(p, nil, true)
		if errors.Is(err, syscall.EAGAIN) {
			return 0, mpa.ErrWouldBlock
		}
		return n, err
	}
	return c.read(p, nil, false)
}

// lend parks the receive goroutine while waiters drive the receive, until
// the baton comes back. ended: a waiter met the end of the stream, which
// end and err give.
func (c *conn) lend() (end rxEnd, err error, ended bool) {
	d := &c.drive
	if d.timer == nil {
		d.t0 = time.Now()
		d.timer = time.AfterFunc(time.Hour, c.lendExpired)
		d.timer.Stop()
	}
	c.release()
	select {
	case <-d.handback:
	case <-c.stop:
		c.reclaim()
		<-d.handback // from reclaim, or from the waiter once the reset ends its read
	}
	if d.ended {
		return d.end, d.endErr, true
	}
	return 0, nil, false
}

// release lends the receive (its holder pauses): it wakes the waiter that
// asked for it and sets the timer that takes it back, or gives it back at
// once when no waiter may drive it now (a direct handler was set).
func (c *conn) release() {
	d := &c.drive
	d.lastExit.Store(int64(time.Since(d.t0)))
	d.baton.Store(batonLent)
	if !c.drivable() {
		c.reclaim() // the direct handler runs on the receive goroutine
		return
	}
	c.signalWant()
	c.armLend(c.lendFor())
}

// signalWant wakes the waiter that asked for the receive, now lent.
func (c *conn) signalWant() {
	if cq := c.drive.want.Swap(nil); cq != nil {
		cq.signal()
	}
}

func (c *conn) armLend(after time.Duration) {
	if c.drive.armed.CompareAndSwap(false, true) {
		c.drive.timer.Reset(after)
	}
}

// lendExpired runs lendFor after the receive was lent or a waiter paused:
// the receive goroutine takes the receive back if no waiter took it since.
func (c *conn) lendExpired() {
	d := &c.drive
	d.armed.Store(false)
	if d.baton.Load() != batonLent {
		return // a waiter drives: it arms the timer again when it pauses
	}
	if idle := time.Duration(int64(time.Since(d.t0)) - d.lastExit.Load()); idle < c.lendFor() {
		c.armLend(c.lendFor() - idle)
		return
	}
	c.reclaim()
}

// reclaim gives a lent receive back to the receive goroutine.
func (c *conn) reclaim() {
	if c.drive.baton.CompareAndSwap(batonLent, batonRecv) {
		c.drive.handback <- struct{}{}
	}
}

// driveFor runs the stream's receive in the calling goroutine (CQ.Wait on
// cq) until cq holds a completion, ctx ends, a kick, or the end of the
// stream. It reports false, having done nothing, when it could not take the
// receive: the receive goroutine then lends it at its next pause and
// signals cq.
func (c *conn) driveFor(ctx context.Context, cq *CQ) bool {
	d := &c.drive
	for !d.baton.CompareAndSwap(batonLent, batonWaiter) {
		// Ask for it; if it was lent meanwhile (and the lender missed
		// the request), try again.
		d.want.Store(cq)
		if d.baton.Load() != batonLent {
			return false
		}
	}
	if done := ctx.Done(); done != d.watchDone {
		if d.watchStop != nil {
			d.watchStop()
		}
		d.watchDone, d.watchStop = done, nil
		if done != nil {
			d.watchStop = context.AfterFunc(ctx, c.ctxEnded)
		}
	}
	r := &c.rx
	r.driver, r.driveCtx = cq, ctx
	cq.driving.Store(c)
	end, err, paused := r.loop()
	cq.driving.Store(nil)
	r.driver, r.driveCtx = nil, nil
	if !paused {
		c.unwatch()
		d.ended, d.end, d.endErr = true, end, err
		d.baton.Store(batonRecv)
		d.handback <- struct{}{}
		return true
	}
	c.release()
	return true
}

func (c *conn) lendFor() time.Duration {
	if d := c.dev.cfg.lendFor; d > 0 {
		return d
	}
	return lendFor
}

// ctxEnded kicks the waiter driving the receive when a waiter's ctx ends.
// A waiter that takes the receive later sees the end itself (readIdle),
// and a ctx cancelled after its Wait returned (a deferred cancel) costs
// nothing.
func (c *conn) ctxEnded() {
	if c.drive.baton.Load() == batonWaiter {
		c.kickWaiter()
	}
}

// unwatch stops watching the waiters' ctx (the stream ended).
func (c *conn) unwatch() {
	d := &c.drive
	if d.watchStop != nil {
		d.watchStop()
	}
	d.watchDone, d.watchStop = nil, nil
}

// driveEnd stops what the consumer-driven receive left running once the
// receive loop has ended for good.
func (c *conn) driveEnd() {
	c.unwatch()
	if t := c.drive.timer; t != nil {
		t.Stop()
	}
}

// drivable reports whether a waiter on one of the QP's CQs may drive the
// receive now: neither CQ hands its completions to a direct handler.
func (c *conn) drivable() bool {
	cfg := &c.qp.cfg
	return !cfg.SendCQ.hasDirect.Load() && !cfg.RecvCQ.hasDirect.Load()
}
