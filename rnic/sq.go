package rnic

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// The send queue: a power-of-two ring of WQEs with three free-running
// cursors. head is the oldest WQE whose completion has not been emitted,
// next is the next WQE the transmitter will start, tail is the next free
// slot: head <= next <= tail. A WQE keeps its position (the cursor value
// it was posted at) for its life, resizes included: SQMark names WQEs by
// it. WQEs complete in any order internally (a Send
// when handed to TCP, a Read when its response arrives) but their
// completions leave in posting order (RFC 5040 §5.5 rule 15).

type sqState uint8

const (
	sqPosted sqState = iota
	sqStarted
	sqDone
)

type sqEntry struct {
	wr     SendWR
	sgl    []SGE // owned copy of wr.SGL
	state  sqState
	status Status
	// fr and bind are owned copies of the WR's pointers.
	fr   FastReg
	bind BindMW
}

type sendQueue struct {
	mu               sync.Mutex
	ring             []sqEntry
	mask             uint32
	head, next, tail uint32
	// gathered is how far the transmitter has gathered: every WQE before
	// it has had its bytes copied into the stream (or needed none, or was
	// flushed). SendGathered reads it without q.mu (the handler checking
	// an answer should not wait on the transmitter).
	gathered    atomic.Uint32
	depth       int
	maxSGE      int
	maxWriteSGE int

	// ord is the FIFO of outstanding RDMA Reads and atomics, in request
	// order (their responses arrive in this order).
	ord []ordEntry
}

// ordEntry is an outstanding RDMA Read or Atomic Request.
type ordEntry struct {
	idx    uint32 // SQ position; internal (RTR) entries have wqe=false
	wqe    bool
	atomic bool
	reqID  uint32
	sink   STag
	sinkTO uint64
	size   uint32
	got    uint64 // Read Response bytes received
}

func newSendQueue(depth, maxSGE, maxWriteSGE int) *sendQueue {
	n := ceilPow2(depth)
	q := &sendQueue{ring: make([]sqEntry, n), mask: uint32(n - 1), depth: depth, maxSGE: maxSGE, maxWriteSGE: maxWriteSGE}
	m := max(maxSGE, maxWriteSGE)
	for i := range q.ring {
		q.ring[i].sgl = make([]SGE, 0, m)
	}
	return q
}

func (q *sendQueue) at(i uint32) *sqEntry { return &q.ring[i&q.mask] }

// gatheredTo records that the transmitter has gathered the WQE at idx, and
// so every one before it. It only moves the cursor forward: a flush of the
// queue (flushLocked) may have moved it past idx while an inline poster
// was still gathering.
func (q *sendQueue) gatheredTo(idx uint32) {
	to := idx + 1
	for {
		old := q.gathered.Load()
		if int32(to-old) <= 0 || q.gathered.CompareAndSwap(old, to) {
			return
		}
	}
}

// post appends WRs, already validated. It returns how many were queued:
// fewer than len(wrs) when the queue is full. m, if not nil, records the
// position of the first, before the transmitter (which takes q.mu) can
// start it.
func (q *sendQueue) post(wrs []SendWR, m *SQMark) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if m != nil {
		m.pos.Store(uint64(q.tail) + 1)
	}
	for i := range wrs {
		wr := &wrs[i]
		if int(q.tail-q.head) >= q.depth {
			return i, fmt.Errorf("rnic: post send %d: %w", wr.ID, ErrTooManyWRs)
		}
		e := q.at(q.tail)
		e.wr = *wr
		e.sgl = append(e.sgl[:0], wr.SGL...)
		e.wr.SGL = e.sgl
		if wr.FastReg != nil {
			e.fr = *wr.FastReg
			e.wr.FastReg = &e.fr
		}
		if wr.Bind != nil {
			e.bind = *wr.Bind
			e.wr.Bind = &e.bind
		}
		e.state = sqPosted
		e.status = StatusSuccess
		q.tail++
	}
	return len(wrs), nil
}

// completeLocked marks the WQE at idx finished with st and emits every
// completion now due, in order. It reports false if the CQ overflowed.
// q.mu is held. rx is the stream's receiver when it is the one completing
// (see CQ.pushHeld), else nil.
func (q *sendQueue) completeLocked(qp *QP, idx uint32, st Status, rx *rxState) bool {
	e := q.at(idx)
	e.state = sqDone
	e.status = st
	return q.emitLocked(qp, rx)
}

func (q *sendQueue) emitLocked(qp *QP, rx *rxState) bool {
	ok := true
	for q.head != q.next {
		e := q.at(q.head)
		if e.state != sqDone {
			break
		}
		if !e.wr.Unsignaled || e.status != StatusSuccess {
			wc := WC{ID: e.wr.ID, Op: e.wr.Op, Status: e.status, QPID: qp.id}
			if !qp.cfg.SendCQ.pushHeld(wc, nil, rx) {
				ok = false
			}
		}
		e.wr = SendWR{}
		q.head++
	}
	return ok
}

// flushLocked completes every WQE not yet completed with Flushed, in order.
func (q *sendQueue) flushLocked(qp *QP) {
	for i := q.head; i != q.tail; i++ {
		e := q.at(i)
		if e.state != sqDone {
			e.state = sqDone
			e.status = StatusFlushed
		}
	}
	q.next = q.tail
	q.gatheredTo(q.next - 1)
	q.ord = q.ord[:0]
	q.emitLocked(qp, nil)
}

// outstandingReads counts outstanding Read and Atomic requests.
func (q *sendQueue) outstandingReads() int { return len(q.ord) }

// popORD drops the oldest outstanding Read or atomic (q.mu held). It
// shifts rather than reslices, so the queue keeps its capacity and
// appending the next one does not allocate.
func (q *sendQueue) popORD() {
	n := copy(q.ord, q.ord[1:])
	q.ord = q.ord[:n]
}

// transmitting reports whether the transmitter has a WQE in hand that
// completes without the peer (a Send or Write being written out; a Read
// or atomic waits for its response).
func (q *sendQueue) transmitting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := q.head; i != q.next; i++ {
		if e := q.at(i); e.state == sqStarted && !e.wr.Op.isReadLike() {
			return true
		}
	}
	return false
}

func (q *sendQueue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == q.tail
}

func (q *sendQueue) resize(depth int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	cur := int(q.tail - q.head)
	if depth < cur {
		return fmt.Errorf("rnic: resize SQ to %d with %d outstanding: %w", depth, cur, ErrShrink)
	}
	n := ceilPow2(depth)
	if n != len(q.ring) {
		// The WQEs keep their positions (cur <= n consecutive positions
		// map to distinct slots of the new ring).
		ring := make([]sqEntry, n)
		mask := uint32(n - 1)
		for p := q.head; p != q.tail; p++ {
			d := &ring[p&mask]
			*d = *q.at(p)
			// Re-point the WR's internal pointers at the new slot.
			d.wr.SGL = d.sgl
			if d.wr.FastReg != nil {
				d.wr.FastReg = &d.fr
			}
			if d.wr.Bind != nil {
				d.wr.Bind = &d.bind
			}
		}
		m := max(q.maxSGE, q.maxWriteSGE)
		for i := range ring {
			if ring[i].sgl == nil {
				ring[i].sgl = make([]SGE, 0, m)
			}
		}
		q.ring, q.mask = ring, mask
	}
	q.depth = depth
	return nil
}
