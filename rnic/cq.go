package rnic

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// CQ is a completion queue (draft §5.3): a power-of-two ring of work
// completions with free-running head and tail counters.
type CQ struct {
	dev *Device

	mu   sync.Mutex
	ring []WC
	// held[i] is the QP whose S-RQ WQE ring[i] completes (nil otherwise):
	// polling it ends that WQE's progress for the QP RQ Limit (draft
	// §6.3.7, §6.3.8).
	held       []*QP
	mask       uint32
	head, tail uint32 // poll at head, add at tail; tail-head = entries queued
	size       int    // entries the consumer asked for (<= len(ring))
	armed      notifyKind
	handler    HandlerID
	users      int
	overflowed bool
	dead       bool
	ch         chan struct{}
	// headA and tailA mirror head and tail for lock-free emptiness checks.
	headA, tailA atomic.Uint32
	// direct is the direct handler (SetDirectHandler), or nil; hasDirect
	// mirrors direct != nil for lock-free checks.
	direct    func() bool
	hasDirect atomic.Bool
	// deferredFire: a completion deferred to the direct handler (pushHeld)
	// met the armed notification when it was queued; if the handler
	// declines, the notification fires for it (runDirect).
	deferredFire bool
	// drv is the one attached stream whose QP uses this CQ alone, whose
	// receive Wait may drive (drive.go); nil when there is none.
	drv atomic.Pointer[conn]
	// driving is the stream a waiter on this CQ drives now, or nil: a
	// completion queued from elsewhere kicks it.
	driving atomic.Pointer[conn]
}

type notifyKind uint8

const (
	notifyNone notifyKind = iota
	notifySolicited
	notifyNext
)

func ceilPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// CreateCQ creates a completion queue with room for at least entries
// completions. handler (0 for none) is called when an armed notification
// fires.
func (d *Device) CreateCQ(entries int, handler HandlerID) (*CQ, error) {
	if entries <= 0 {
		return nil, fmt.Errorf("rnic: create CQ: %w: %d entries", ErrInvalidModifier, entries)
	}
	if entries > d.cfg.MaxCQE {
		return nil, fmt.Errorf("rnic: create CQ: %w: %d > %d", ErrCQExceedsCapability, entries, d.cfg.MaxCQE)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if handler != 0 {
		if _, ok := d.handlers[handler]; !ok {
			return nil, fmt.Errorf("rnic: create CQ: %w", ErrInvalidHandler)
		}
	}
	if len(d.cqs) >= d.cfg.MaxCQ {
		return nil, fmt.Errorf("rnic: create CQ: %w", ErrInsufficientResources)
	}
	n := ceilPow2(entries)
	cq := &CQ{dev: d, ring: make([]WC, n), held: make([]*QP, n), mask: uint32(n - 1), size: n, handler: handler,
		ch: make(chan struct{}, 1)}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// Query returns the number of entries and the completion handler.
func (cq *CQ) Query() (entries int, handler HandlerID) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.size, cq.handler
}

// Len is the number of completions waiting to be polled.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return int(cq.tail - cq.head)
}

// Poll moves up to len(wcs) completions into wcs and returns how many.
// Once it has made room, a later overflow is reported again.
func (cq *CQ) Poll(wcs []WC) int {
	cq.mu.Lock()
	n := 0
	for n < len(wcs) && cq.head != cq.tail {
		i := cq.head & cq.mask
		wcs[n] = cq.ring[i]
		if qp := cq.held[i]; qp != nil {
			qp.srqHeld.Add(-1)
			cq.held[i] = nil
		}
		cq.head++
		n++
	}
	if n > 0 {
		cq.overflowed = false
	}
	cq.headA.Store(cq.head)
	cq.mu.Unlock()
	return n
}

// RequestNotify arms the CQ once: the next completion added (or, with
// solicitedOnly, the next solicited or failed one) calls the handler and
// signals C(). Completions already queued do not fire it.
func (cq *CQ) RequestNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return fmt.Errorf("rnic: request notification: %w", ErrInvalidCQ)
	}
	k := notifyNext
	if solicitedOnly {
		k = notifySolicited
	}
	if k > cq.armed {
		cq.armed = k
	}
	return nil
}

// C is signalled (capacity one, never blocks the engine) each time an armed
// notification fires.
func (cq *CQ) C() <-chan struct{} { return cq.ch }

// Wait polls completions into wcs, blocking until at least one is there or
// ctx ends. It uses the arm-then-poll sequence, so no completion is missed.
//
// When one attached stream uses the CQ alone and neither of its QP's CQs
// has a direct handler, Wait runs that stream's receive itself, waiting in
// the network poller on its socket, rather than being woken by the receive
// goroutine (drive.go; unless Config.NoWaitDrive). Between Waits the
// receive stays with the waiters for a while (lendFor): what arrives for
// the stream meanwhile is read at the next Wait, or by the receive
// goroutine once that time has passed. While Wait runs the receive, its
// ctx ends the wait at the stream's next FPDU boundary. Wait may signal
// C() spuriously. An empty wcs is ErrInvalidLength: no completion could
// end the wait.
func (cq *CQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, fmt.Errorf("rnic: wait for completions into an empty slice: %w", ErrInvalidLength)
	}
	c := cq.drv.Load()
	if c != nil && !c.drivable() {
		c = nil
	}
	if c == nil {
		spin := 0
		if spinHelps() {
			spin = waitSpin
		}
		for i := 0; i < spin; i++ {
			if cq.pending() {
				break
			}
			runtime.Gosched()
		}
	}
	for {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if c != nil {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if c.driveFor(ctx, cq) {
				continue
			}
		}
		if err := cq.RequestNotify(false); err != nil {
			return 0, err
		}
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		select {
		case <-cq.ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// signal wakes a waiter parked in Wait (or a reader of C()) without a
// completion: the receive it asked for is lent (drive.go).
func (cq *CQ) signal() {
	select {
	case cq.ch <- struct{}{}:
	default:
	}
}

// waitSpin is how many times Wait yields while polling before it parks: a
// completion that lands within a few microseconds is then picked up without
// waking a sleeping thread (which costs more than the spin).
const waitSpin = 16

// spinHelps reports whether yielding while polling can let a completion
// in: only with another P, which runs the engine's receivers meanwhile.
// With one (GOMAXPROCS=1, as in a container of one CPU), the yielding
// goroutine is the next to run again, while the receivers wait in the
// network poller until it parks: every yield is lost (BenchmarkRead4K at
// GOMAXPROCS=1: 7.4 us with the spin, 6.0 without).
func spinHelps() bool { return runtime.GOMAXPROCS(0) > 1 }

// pending reports queued completions without taking the lock.
func (cq *CQ) pending() bool { return cq.tailA.Load() != cq.headA.Load() }

// Resize changes the capacity to at least entries, keeping every queued
// completion; shrinking below the number queued fails with ErrCQShrink.
func (cq *CQ) Resize(entries int) (int, error) {
	if entries <= 0 || entries > cq.dev.cfg.MaxCQE {
		return 0, fmt.Errorf("rnic: resize CQ: %w: %d entries", ErrCQExceedsCapability, entries)
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return 0, fmt.Errorf("rnic: resize CQ: %w", ErrInvalidCQ)
	}
	q := int(cq.tail - cq.head)
	if entries < q {
		return 0, fmt.Errorf("rnic: resize CQ to %d with %d queued: %w", entries, q, ErrCQShrink)
	}
	n := ceilPow2(entries)
	ring := make([]WC, n)
	held := make([]*QP, n)
	for i := 0; i < q; i++ {
		ring[i] = cq.ring[(cq.head+uint32(i))&cq.mask]
		held[i] = cq.held[(cq.head+uint32(i))&cq.mask]
	}
	cq.ring, cq.held, cq.mask, cq.head, cq.tail, cq.size = ring, held, uint32(n-1), 0, uint32(q), n
	cq.headA.Store(0)
	cq.tailA.Store(uint32(q))
	cq.overflowed = false
	return n, nil
}

// Destroy frees the CQ; it fails with ErrCQInUse while a work queue uses it.
func (cq *CQ) Destroy() error {
	d := cq.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return fmt.Errorf("rnic: destroy CQ: %w", ErrInvalidCQ)
	}
	if cq.users > 0 {
		return fmt.Errorf("rnic: destroy CQ: %w (%d work queues)", ErrCQInUse, cq.users)
	}
	cq.dead = true
	delete(d.cqs, cq)
	return nil
}

func (cq *CQ) use(delta int) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return ErrInvalidCQ
	}
	cq.users += delta
	if c := cq.drv.Load(); c != nil && delta > 0 {
		// Another work queue: no stream uses this CQ alone any more.
		cq.drv.Store(nil)
		c.reclaim()
	}
	return nil
}

// attach makes c, whose QP uses the CQ with uses work queues (1, or 2 as
// both its send and receive CQ), the stream Wait may drive, if no other
// work queue uses the CQ.
func (cq *CQ) attach(c *conn, uses int) {
	cq.mu.Lock()
	if cq.users == uses && c.sr != nil && !cq.dev.cfg.NoWaitDrive {
		cq.drv.Store(c)
	}
	cq.mu.Unlock()
}

// detach forgets c as the stream Wait may drive.
func (cq *CQ) detach(c *conn) { cq.drv.CompareAndSwap(c, nil) }

// push adds a completion. It reports false on overflow: the completion is not
// stored (nothing is ever overwritten) and a CQ Overflow event is raised,
// once per overflow: the next one is reported after the consumer has polled
// (draft §5.3.1 leaves the semantics to the RI; each is detected).
func (cq *CQ) push(wc WC) bool { return cq.pushHeld(wc, nil, nil) }

// pushHeld is push for the completion of an S-RQ WQE taken by qp: the WQE
// counts as in progress on qp until the completion is polled. rx is the
// receiver of the stream pushing it, nil for anything else: a CQ with a
// direct handler then defers its notification to the end of rx's batch.
func (cq *CQ) pushHeld(wc WC, qp *QP, rx *rxState) bool {
	cq.mu.Lock()
	if cq.dead {
		cq.mu.Unlock()
		if qp != nil {
			qp.srqHeld.Add(-1)
		}
		return true
	}
	if int(cq.tail-cq.head) >= len(cq.ring) {
		first := !cq.overflowed
		cq.overflowed = true
		cq.mu.Unlock()
		if qp != nil {
			qp.srqHeld.Add(-1) // lost: never retrieved
		}
		if first {
			cq.dev.raise(AsyncEvent{Type: EventCQOverflow, Resource: ResourceCQ, CQ: cq})
		}
		return false
	}
	cq.ring[cq.tail&cq.mask] = wc
	cq.held[cq.tail&cq.mask] = qp
	cq.tail++
	cq.tailA.Store(cq.tail)
	fire := cq.armed == notifyNext || (cq.armed == notifySolicited && (wc.Solicited || wc.Status != StatusSuccess))
	if rx != nil && cq.direct != nil {
		if fire {
			cq.deferredFire = true
		}
		cq.mu.Unlock()
		rx.deferTo(cq) // the direct handler takes it at the batch's end
		return true
	}
	var h HandlerID
	if fire {
		cq.armed = notifyNone
		h = cq.handler
	}
	cq.mu.Unlock()
	if d := cq.driving.Load(); d != nil && rx != &d.rx {
		// A waiter drives a stream's receive, and this completion does
		// not come from it: it would not see it before that stream's
		// next bytes.
		d.kickWaiter()
	}
	if fire {
		cq.fire(h)
	}
	return true
}

// fire signals C() and calls the CQ's completion handler (not the direct
// one) through the dispatcher.
func (cq *CQ) fire(h HandlerID) {
	select {
	case cq.ch <- struct{}{}:
	default:
	}
	if h != 0 {
		if fn := cq.dev.handler(h); fn != nil {
			cq.dev.disp.post(func() { fn(cq) })
		}
	}
}

// SetDirectHandler is an extension of the verbs for run-to-completion
// consumers: the receive goroutine of a stream whose QP queues completions
// on cq calls fn itself, once it is done with what it has read from the
// connection and before it reads again, instead of firing the CQ's
// notification for them. Completions queued otherwise (by the transmitter,
// by a flush) notify as usual. fn returns false if it could not take the
// completions now (another goroutine is polling); the notification then
// fires as it would have. fn runs on the engine: it may poll the CQ and
// post work requests (they go out without a hand-off), but it must not
// block for long, and must not wait for a QP's state or destroy one (a
// Modify to Error waits for the receive goroutine that is running fn).
// nil restores the notification.
func (cq *CQ) SetDirectHandler(fn func() bool) {
	cq.mu.Lock()
	cq.direct = fn
	cq.hasDirect.Store(fn != nil)
	cq.mu.Unlock()
	if c := cq.drv.Load(); c != nil && fn != nil {
		c.reclaim() // the receive goroutine runs fn: give it the receive now
		if c.drive.baton.Load() == batonWaiter {
			c.kickWaiter() // a waiter drives: it gives it back when it pauses
		}
	}
}

// runDirect calls the direct handler at the end of a receive batch, or,
// if it declines, fires the notification the batch's completions deferred:
// only if one of them met the arming when it was queued, as push would
// have fired it (an unsolicited completion does not fire a CQ armed for
// solicited ones). A completion deferred by another stream's batch after
// the handler was called is that batch's to notify, unless this one fires.
func (cq *CQ) runDirect() {
	cq.mu.Lock()
	fn := cq.direct
	due := cq.deferredFire
	cq.deferredFire = false
	cq.mu.Unlock()
	if fn != nil && fn() {
		return
	}
	cq.mu.Lock()
	fire := cq.armed != notifyNone && (due || cq.deferredFire)
	var h HandlerID
	if fire {
		cq.armed = notifyNone
		cq.deferredFire = false
		h = cq.handler
	}
	cq.mu.Unlock()
	if fire {
		cq.fire(h)
	}
}
