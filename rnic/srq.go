package rnic

import (
	"fmt"
	"sync"
)

// recvWQE is a posted receive: the consumer's WR ID and a private copy of its
// scatter list.
type recvWQE struct {
	id  uint64
	sgl []SGE
}

// recvQueue is a FIFO of posted receives: a power-of-two ring with
// free-running counters. Both a QP's RQ and an S-RQ are one.
type recvQueue struct {
	mu         sync.Mutex
	ring       []recvWQE
	mask       uint32
	head, tail uint32
	depth      int // maximum outstanding
	maxSGE     int
	inProgress int // taken, not yet completed (QP RQs)
}

func newRecvQueue(depth, maxSGE int) *recvQueue {
	n := ceilPow2(depth)
	q := &recvQueue{ring: make([]recvWQE, n), mask: uint32(n - 1), depth: depth, maxSGE: maxSGE}
	for i := range q.ring {
		q.ring[i].sgl = make([]SGE, 0, maxSGE)
	}
	return q
}

// post appends WRs; it stops at the first one that fails and returns how
// many were queued.
func (q *recvQueue) post(wrs []RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > q.maxSGE {
			return i, fmt.Errorf("rnic: post receive %d: %w: %d SGEs, at most %d", wr.ID, ErrInvalidSGLLength, len(wr.SGL), q.maxSGE)
		}
		if err := checkRecvSGL(wr); err != nil {
			return i, err
		}
		if int(q.tail-q.head)+q.inProgress >= q.depth {
			return i, fmt.Errorf("rnic: post receive %d: %w", wr.ID, ErrTooManyWRs)
		}
		slot := &q.ring[q.tail&q.mask]
		slot.id = wr.ID
		slot.sgl = append(slot.sgl[:0], wr.SGL...)
		q.tail++
	}
	return len(wrs), nil
}

// take removes the oldest posted receive. The returned WQE's SGL is a copy
// owned by the caller.
func (q *recvQueue) take(dst *recvWQE) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == q.tail {
		return false
	}
	slot := &q.ring[q.head&q.mask]
	dst.id = slot.id
	dst.sgl = append(dst.sgl[:0], slot.sgl...)
	q.head++
	q.inProgress++
	return true
}

// done marks a taken WQE completed.
func (q *recvQueue) done() {
	q.mu.Lock()
	q.inProgress--
	q.mu.Unlock()
}

// drain removes every posted receive, calling f for each in order.
func (q *recvQueue) drain(f func(id uint64)) {
	q.mu.Lock()
	var ids []uint64
	for q.head != q.tail {
		ids = append(ids, q.ring[q.head&q.mask].id)
		q.head++
	}
	q.mu.Unlock()
	for _, id := range ids {
		f(id)
	}
}

func (q *recvQueue) available() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(q.tail - q.head)
}

func (q *recvQueue) resize(depth int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	cur := int(q.tail-q.head) + q.inProgress
	if depth < cur {
		return fmt.Errorf("rnic: resize to %d with %d outstanding: %w", depth, cur, ErrShrink)
	}
	n := ceilPow2(depth)
	if n != len(q.ring) {
		ring := make([]recvWQE, n)
		k := int(q.tail - q.head)
		for i := 0; i < k; i++ {
			ring[i] = q.ring[(q.head+uint32(i))&q.mask]
		}
		for i := k; i < n; i++ {
			ring[i].sgl = make([]SGE, 0, q.maxSGE)
		}
		q.ring, q.mask, q.head, q.tail = ring, uint32(n-1), 0, uint32(k)
	}
	q.depth = depth
	return nil
}

// SRQ is a shared receive queue (draft §6.3). WQEs are taken in arrival
// order by whichever QP receives a message first.
type SRQ struct {
	dev *Device
	pd  *PD
	q   *recvQueue

	mu         sync.Mutex
	limit      int
	limitArmed bool
	users      int
	dead       bool
}

// SRQInfo is what Query S-RQ returns.
type SRQInfo struct {
	MaxWR      int
	MaxSGE     int
	PD         uint32
	Limit      int
	LimitArmed bool
	Available  int
}

// CreateSRQ creates a shared receive queue. A limit > 0 arms the S-RQ Limit
// event: it fires once when fewer than limit WQEs remain.
func (d *Device) CreateSRQ(pd *PD, maxWR, maxSGE, limit int) (*SRQ, error) {
	if maxWR <= 0 || maxWR > d.cfg.MaxSRQWR {
		return nil, fmt.Errorf("rnic: create S-RQ: %w: %d WRs", ErrWRExceedsCapability, maxWR)
	}
	if maxSGE <= 0 || maxSGE > d.cfg.MaxSGE {
		return nil, fmt.Errorf("rnic: create S-RQ: %w: %d SGEs", ErrSGEExceedsCapability, maxSGE)
	}
	if limit < 0 || limit > maxWR {
		return nil, fmt.Errorf("rnic: create S-RQ: %w", ErrSRQLimit)
	}
	d.mu.Lock()
	if len(d.srqs) >= d.cfg.MaxSRQ {
		d.mu.Unlock()
		return nil, fmt.Errorf("rnic: create S-RQ: %w", ErrInsufficientResources)
	}
	d.mu.Unlock()
	if err := pd.ref(); err != nil {
		return nil, fmt.Errorf("rnic: create S-RQ: %w", err)
	}
	s := &SRQ{dev: d, pd: pd, q: newRecvQueue(maxWR, maxSGE), limit: limit, limitArmed: limit > 0}
	d.mu.Lock()
	d.srqs[s] = struct{}{}
	d.mu.Unlock()
	return s, nil
}

// Post posts receive WRs to the S-RQ. It returns how many were queued.
func (s *SRQ) Post(wrs ...RecvWR) (int, error) {
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	if dead {
		return 0, fmt.Errorf("rnic: post to S-RQ: %w", ErrInvalidSRQ)
	}
	return s.q.post(wrs)
}

// Query returns the S-RQ's attributes.
func (s *SRQ) Query() SRQInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQInfo{MaxWR: s.q.depth, MaxSGE: s.q.maxSGE, PD: s.pd.id, Limit: s.limit, LimitArmed: s.limitArmed,
		Available: s.q.available()}
}

// Modify resizes the S-RQ (maxWR > 0) and sets and arms its limit (arm).
func (s *SRQ) Modify(maxWR int, limit int, arm bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return fmt.Errorf("rnic: modify S-RQ: %w", ErrInvalidSRQ)
	}
	newMax := s.q.depth
	if maxWR > 0 {
		if maxWR > s.dev.cfg.MaxSRQWR {
			return fmt.Errorf("rnic: modify S-RQ: %w", ErrWRExceedsCapability)
		}
		newMax = maxWR
	}
	if (arm || s.limitArmed) && newMax < limit {
		// Draft §6.3.8: an armed limit above the new size is an invalid
		// input modifier (Fig. 31 calls it "S-RQ Limit out of range").
		return fmt.Errorf("rnic: modify S-RQ: %w: %w", ErrInvalidModifier, ErrSRQLimit)
	}
	if limit < 0 || limit > newMax {
		return fmt.Errorf("rnic: modify S-RQ: %w", ErrSRQLimit)
	}
	if maxWR > 0 {
		if err := s.q.resize(maxWR); err != nil {
			return err
		}
	}
	s.limit = limit
	if arm {
		s.limitArmed = limit > 0
	}
	return nil
}

// Destroy frees the S-RQ; it fails with ErrSRQInUse while QPs use it. WQEs
// still posted vanish without completions.
func (s *SRQ) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return fmt.Errorf("rnic: destroy S-RQ: %w", ErrInvalidSRQ)
	}
	if s.users > 0 {
		return fmt.Errorf("rnic: destroy S-RQ: %w", ErrSRQInUse)
	}
	s.dead = true
	s.dev.mu.Lock()
	delete(s.dev.srqs, s)
	s.dev.mu.Unlock()
	s.pd.unref()
	return nil
}

// take gives a QP the oldest WQE and fires the limit event when the S-RQ
// runs low.
func (s *SRQ) take(dst *recvWQE) bool {
	ok := s.q.take(dst)
	if ok {
		s.q.done() // S-RQ WQEs belong to the QP once taken
	}
	s.mu.Lock()
	fire := s.limitArmed && s.q.available() < s.limit
	if fire {
		s.limitArmed = false
	}
	s.mu.Unlock()
	if fire {
		s.dev.raise(AsyncEvent{Type: EventSRQLimitReached, Resource: ResourceSRQ, SRQ: s})
	}
	return ok
}
