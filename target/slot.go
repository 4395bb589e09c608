package target

import (
	"fmt"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// slotState is where a slot's exchange stands.
type slotState uint8

const (
	slotFree         slotState = iota
	slotBusy                   // a command is executing
	slotAwaitRelease           // READY of a READ sent; waiting for RELEASE
	slotAwaitWrite             // READY of a WRITE_REQ sent; waiting for WRITE (or RELEASE)
)

// slot is one credit of a QP: the state of one exchange, the worker that
// executes its commands, and the preallocated pieces its messages and work
// requests are built from (no allocation per command).
type slot struct {
	q   *qconn
	idx int

	mu      sync.Mutex // state, buf, stag, deadline: poller, worker and lease timer
	state   slotState
	cmd     [blockproto.CommandLen]byte
	arrived time.Time // set by the poller when the command arrives
	began   time.Time // the worker's copy: the poller rewrites arrived once the answer frees the slot
	grant   *grant    // the grant a WRITE consumed

	mr       *rnic.MR  // the slot's buffer STag (READ and WRITE_REQ)
	stag     rnic.STag // as last registered
	buf      []byte    // pooled buffer of the current exchange
	head     int       // data offset in buf (offset mod 4096)
	reqOff   uint64    // WRITE_REQ range, which its WRITE must repeat
	reqLen   uint32
	lease    *time.Timer
	deadline time.Time // of the lease; a timer firing early (stale) is ignored
	scratch  []byte    // one block for read-modify-write edges

	wake  chan struct{}
	pages [1][]byte
	fr    rnic.FastReg
	gfr   rnic.FastReg
	wrs   [3]rnic.SendWR
	sge   [1]rnic.SGE
}

// setupSlots creates n slots with their STags, timers and workers.
func (q *qconn) setupSlots(n int) error {
	q.slots = make([]slot, n)
	for i := range q.slots {
		s := &q.slots[i]
		s.q, s.idx = q, i
		s.wake = make(chan struct{}, 1)
		s.scratch = make([]byte, store.BlockSize)
		mr, err := q.pd.AllocMRSTag(1, true)
		if err != nil {
			return fmt.Errorf("target: allocate slot STag: %w", err)
		}
		s.mr = mr
		s.stag = mr.STag()
		s.lease = time.AfterFunc(time.Hour, s.expire)
		s.lease.Stop()
	}
	return nil
}

// startWorkers starts the poller and one worker per slot.
func (q *qconn) startWorkers() {
	q.wg.Add(1 + len(q.slots))
	go q.poll()
	for i := range q.slots {
		go q.work(&q.slots[i])
	}
}

func (q *qconn) work(s *slot) {
	defer q.wg.Done()
	for {
		select {
		case <-s.wake:
		case <-q.ctx.Done():
			return
		}
		s.began = s.arrived
		q.execute(s)
		q.t.end()
	}
}

// onRecv handles one received message (poller goroutine): it checks it,
// reposts the receive, then advances the slot's exchange. An error is a
// protocol violation.
func (q *qconn) onRecv(wc *rnic.WC) error {
	i := int(wc.ID)
	msg := q.rx(i)[:wc.Bytes]
	c, err := blockproto.ParseCommand(msg)
	if err != nil {
		return fmt.Errorf("message on QP after login: %w", err)
	}
	var cmd [blockproto.CommandLen]byte
	copy(cmd[:], c)
	if err := q.postRecv(i); err != nil {
		q.markDead()
		return nil
	}
	c = cmd[:]
	k := int(c.Tag() & 0xFFFF)
	if k >= len(q.slots) {
		return fmt.Errorf("%s with slot %d, credits %d", c.Op(), k, len(q.slots))
	}
	s := &q.slots[k]
	stag := rnic.STag(c.STag())
	invalidated := wc.HasInvalidated && wc.Invalidated == stag
	if wc.HasInvalidated && !invalidated {
		return fmt.Errorf("%s invalidated STag %s but names %s", c.Op(), wc.Invalidated, stag)
	}
	s.mu.Lock()
	switch c.Op() {
	case blockproto.OpRelease:
		if !invalidated || (s.state != slotAwaitRelease && s.state != slotAwaitWrite) || stag != s.stag {
			st := s.state
			s.mu.Unlock()
			return fmt.Errorf("RELEASE of %s on slot %d in state %d (invalidated %v)", stag, k, st, invalidated)
		}
		s.endExchangeLocked()
		s.mu.Unlock()
		return nil
	case blockproto.OpWrite:
		if !invalidated {
			s.mu.Unlock()
			return fmt.Errorf("WRITE naming %s was not a Send with Invalidate of it", stag)
		}
		switch {
		case s.state == slotAwaitWrite && stag == s.stag:
			s.lease.Stop()
		case s.state == slotFree:
			g := q.grants.consume(stag)
			if g == nil {
				s.mu.Unlock()
				return fmt.Errorf("WRITE names %s, not an outstanding grant", stag)
			}
			s.grant = g
		default:
			st := s.state
			s.mu.Unlock()
			return fmt.Errorf("WRITE on slot %d in state %d", k, st)
		}
	default:
		if wc.HasInvalidated {
			s.mu.Unlock()
			return fmt.Errorf("%s sent with Invalidate", c.Op())
		}
		if s.state != slotFree {
			st := s.state
			s.mu.Unlock()
			return fmt.Errorf("%s on busy slot %d (state %d)", c.Op(), k, st)
		}
	}
	s.state = slotBusy
	s.cmd = cmd
	s.arrived = time.Now()
	s.mu.Unlock()
	if !q.t.begin() {
		return nil // draining: no answer; GOODBYE follows and the initiator replays
	}
	if q.runsHere(s) {
		s.began = s.arrived
		q.execute(s)
		q.t.end()
		return nil
	}
	s.wake <- struct{}{}
	return nil
}

// maxHere is the largest command the poller runs itself.
const maxHere = 64 << 10

// runsHere reports whether the poller runs the slot's command itself
// instead of waking the slot's worker: an inline READ or a granted WRITE,
// of whole blocks and at most maxHere bytes, on a volume in memory. Such a
// command only copies memory and posts Sends: it takes no pooled buffer
// (a buffer could wait for a RELEASE that only this poller can see) and
// waits for no I/O, and a burst of them then leaves in one write.
func (q *qconn) runsHere(s *slot) bool {
	c := blockproto.Command(s.cmd[:])
	off, n := c.Offset(), c.Length()
	if n > maxHere || off%blk != 0 || n%blk != 0 || !q.sess.vol.v.InMemory() {
		return false
	}
	switch c.Op() {
	case blockproto.OpRead:
		return c.Inline()
	case blockproto.OpWrite:
		return s.grant != nil
	}
	return false
}

// endExchangeLocked returns the exchange's buffer and frees the slot.
func (s *slot) endExchangeLocked() {
	s.lease.Stop()
	s.q.t.pool.put(s.buf)
	s.buf = nil
	s.state = slotFree
}

// armLeaseLocked starts the lease of a buffer just advertised.
func (s *slot) armLeaseLocked() {
	s.deadline = time.Now().Add(s.q.t.cfg.ReadLease)
	s.lease.Reset(s.q.t.cfg.ReadLease)
}

// expire revokes the buffer STag of an exchange whose lease ran out. The
// buffer itself is kept until RELEASE (or teardown): a Read Response may
// still be leaving it.
func (s *slot) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != slotAwaitRelease && s.state != slotAwaitWrite || time.Now().Before(s.deadline) {
		return
	}
	if err := s.mr.Invalidate(); err != nil {
		s.q.log.Warn("revoking an expired buffer", "slot", s.idx, "err", err)
		return
	}
	s.q.t.m.LeaseExpired.Add(1)
	s.q.log.Info("buffer lease expired: STag revoked", "qp", s.q.qp.ID(), "slot", s.idx, "stag", s.stag)
}

// release frees the slot's resources at teardown.
func (s *slot) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease != nil {
		s.lease.Stop()
	}
	s.q.t.pool.put(s.buf)
	s.buf = nil
	if s.grant != nil {
		s.q.grants.putIdle(s.grant)
		s.grant = nil
	}
	if s.mr != nil {
		s.mr.Dealloc()
		s.mr = nil
	}
}
