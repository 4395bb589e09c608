package initiator

import (
	"context"
	"fmt"
	"sync"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
)

// Per-slot send areas: the command, and the RELEASE (which may still wait
// in the send queue when the slot's next command is written); after the
// slots' areas, loginAreas of them hold the login messages.
const (
	areaSize   = 64
	loginAreas = blockproto.MaxMessage / areaSize
	numAtoms   = 16 // atomic operations in flight per QP
)

// Work request IDs of the initiator's send queue.
const (
	idRead = 1 << 62 // | slot: the RDMA Read of a READ exchange
	idAtom = 1 << 61 // | atomic slot
	idMask = 1<<32 - 1
)

// conn is one QP of a session: its endpoint (in the session's protection
// domain), the slots, the write grants the target advertised on it, and
// the atomics in flight.
type conn struct {
	*endpoint.Endpoint
	s       *session
	credits int

	// inline is the largest read answered inline on this QP (0: none):
	// what the WELCOME granted of the askInline the LOGIN asked for, which
	// sized the receive buffers.
	askInline int
	inline    uint32
	// askExtents: the LOGIN asks for BLOCK_STATUS; extents: the WELCOME
	// granted it.
	askExtents, extents bool
	// askNoHole: the LOGIN asks for WRITE_ZEROES with FlagNoHole; noHole:
	// the WELCOME granted it.
	askNoHole, noHole bool

	atomBuf []byte
	atomMR  *rnic.MR
	// lockSTag is the lock table's STag as registered for this QP.
	lockSTag rnic.STag

	slots []slot
	free  chan int // free slot indexes
	atoms [numAtoms]atomSlot
	afree chan int

	gmu    sync.Mutex
	grants []blockproto.GrantFields

	loginArea int // the first of the send areas of the login messages
	// handling is set while the handler delivers a batch (handler only).
	handling bool
	// flushers are the Flushers of the completions delivered in the
	// batch being handled; they are flushed when it ends (handler only).
	flushers []Flusher

	dead     chan struct{}
	deadOnce sync.Once
	// cause is why the QP died (it wraps errConnLost); written once
	// before dead is closed, read only after.
	cause   error
	stopped chan struct{} // closed when stop has failed the exchanges in flight

	// startHook, when set (by tests only, before the QP carries a
	// request), runs in slot.start once the exchange is visible to the
	// handler and to stop.
	startHook func()
}

// atomSlot is one atomic operation's result word and completion.
type atomSlot struct {
	done chan rnic.Status
}

// newConn creates a QP asking for credits and inline reads of up to
// inline bytes (0: none), with its buffers registered and every receive
// posted.
func (s *session) newConn(credits, inline int) (*conn, error) {
	c := s.c
	// Every receive may get a DATA: the credit rules leave no way to
	// steer it to a particular one.
	rxSize := blockproto.MaxMessage
	if inline > 0 {
		rxSize = max(rxSize, blockproto.DataLen(inline))
	}
	// A slot has at most six work requests queued (a WRITE: Fast-Register,
	// RDMA Write, the WRITE, Invalidate; a READ: its command, then
	// Fast-Register and RDMA Read, then Invalidate and RELEASE).
	ep, err := endpoint.New(endpoint.Config{Device: c.dev, PD: s.pd,
		QP: rnic.QPConfig{SQDepth: 6*credits + 2*numAtoms + 8, IRD: 1, ORD: c.cfg.ORD, InboundWrite: true,
			Privileged: true},
		Receives: credits + 2, RecvSize: rxSize,
		SendAreas: 2*credits + loginAreas, SendSize: areaSize,
		// The handler completes requests and flushes their replies
		// without waiting: it runs where the answers arrive.
		Direct: true})
	if err != nil {
		return nil, fmt.Errorf("initiator: %w", err)
	}
	q := &conn{Endpoint: ep, s: s, credits: credits, askInline: inline, loginArea: 2 * credits,
		dead: make(chan struct{}), stopped: make(chan struct{})}
	q.atomBuf = make([]byte, numAtoms*8)
	if q.atomMR, err = ep.Register(q.atomBuf, rnic.LocalRead|rnic.LocalWrite); err != nil {
		ep.Close(nil)
		return nil, fmt.Errorf("initiator: register atomic buffers: %w", err)
	}
	q.afree = make(chan int, numAtoms)
	for i := range q.atoms {
		q.atoms[i].done = make(chan rnic.Status, 1)
		q.afree <- i
	}
	return q, nil
}

// setCredits sizes the slots to what the WELCOME granted, each with the
// STag its Fast-Registers map the caller's memory under.
func (q *conn) setCredits(n int) error {
	q.credits = n
	q.slots = make([]slot, n)
	q.free = make(chan int, n)
	for i := range q.slots {
		sl := &q.slots[i]
		sl.q, sl.idx = q, i
		sl.done = make(chan struct{}, 1)
		mr, err := q.AllocSTag(true)
		if err != nil {
			return fmt.Errorf("initiator: allocate a slot STag: %w", err)
		}
		sl.mr, sl.stag = mr, mr.STag()
		q.free <- i
	}
	return nil
}

// cmdArea and relArea are slot i's command and RELEASE areas.
func cmdArea(i int) int { return 2 * i }
func relArea(i int) int { return 2*i + 1 }

// idle reports whether no exchange and no atomic is in flight on the QP.
func (q *conn) idle() bool { return len(q.free) == len(q.slots) && len(q.afree) == numAtoms }

func (q *conn) isDead() bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// takeGrant returns a write grant, if the QP has one.
func (q *conn) takeGrant() (blockproto.GrantFields, bool) {
	q.gmu.Lock()
	defer q.gmu.Unlock()
	n := len(q.grants)
	if n == 0 {
		return blockproto.GrantFields{}, false
	}
	g := q.grants[n-1]
	q.grants = q.grants[:n-1]
	return g, true
}

// putGrant keeps a write grant from an answer (STag 0: none). The target
// keeps at most C grants outstanding on the QP (blockproto, Write
// grants), C its credits, so no more than C are kept: a target that
// sends more (one with every answer, say) does not grow the list without
// bound; the extra grants are never used.
func (q *conn) putGrant(g blockproto.GrantFields) {
	if g.STag == 0 {
		return
	}
	q.gmu.Lock()
	if len(q.grants) < max(q.credits, 1) {
		q.grants = append(q.grants, g)
	}
	q.gmu.Unlock()
}

// acquire waits for a free slot.
func (q *conn) acquire(ctx context.Context) (*slot, error) {
	select {
	case i := <-q.free:
		return &q.slots[i], nil
	default:
	}
	select {
	case i := <-q.free:
		return &q.slots[i], nil
	case <-q.dead:
		return nil, q.cause
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// tryAcquire returns a free slot, or nil.
func (q *conn) tryAcquire() *slot {
	select {
	case i := <-q.free:
		return &q.slots[i]
	default:
		return nil
	}
}

// die ends the QP from its handler: the connection is reset, the loop
// stops, and (once the engine is done with every buffer, in a goroutine:
// the handler must not wait for that) every exchange in flight fails with
// cause, which wraps errConnLost, and the session is told.
func (q *conn) die(cause error) {
	q.deadOnce.Do(func() {
		q.cause = cause
		close(q.dead)
		q.Kill()
		go q.stop(cause)
	})
}

// stop waits until the engine and the loop are done with the QP, then
// fails the exchanges in flight (no completion can touch them any more)
// and the session, all with the cause: a caller woken by its exchange's
// failure may report the session lost before stop does, and must carry the
// same cause (a protocol error stays one).
func (q *conn) stop(cause error) {
	q.Stopped()
	q.Endpoint.Close(nil)
	for i := range q.slots {
		q.slots[i].fail(cause)
	}
	close(q.stopped)
	q.s.fail(cause)
}
