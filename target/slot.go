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
	c   *conn
	idx int

	mu      sync.Mutex // state, buf, stag, deadline: handler, worker and lease timer
	state   slotState
	cmd     [blockproto.CommandLen]byte
	arrived time.Time // set by the handler when the command arrives
	began   time.Time // the worker's copy: the handler rewrites arrived once the answer frees the slot
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

	// ans marks the post of the last exchange's answer (finish), ansLast
	// the answer's place in it (s.mu for ansLast). The slot is free before
	// that post, so a next command could come before the answer left; an
	// honest initiator only sends it once it has the answer, so it is
	// refused unless the transmitter has gathered the answer, having done
	// with the slot's WRs and its send area.
	ans     rnic.SQMark
	ansLast int

	wake  chan struct{}
	pages [1][]byte
	fr    rnic.FastReg
	gfr   rnic.FastReg
	wrs   [3]rnic.SendWR
	sge   [1]rnic.SGE
}

// setupSlots creates n slots with their STags and timers.
func (c *conn) setupSlots(n int) error {
	c.slots = make([]slot, n)
	for i := range c.slots {
		s := &c.slots[i]
		s.c, s.idx = c, i
		s.wake = make(chan struct{}, 1)
		s.scratch = make([]byte, store.BlockSize)
		mr, err := c.AllocSTag(true)
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

// start starts the completion loop and one worker per slot.
func (c *conn) start() {
	c.workers.Add(len(c.slots))
	for i := range c.slots {
		go c.work(&c.slots[i])
	}
	c.Start(c.handle)
}

func (c *conn) work(s *slot) {
	defer c.workers.Done()
	for {
		select {
		case <-s.wake:
		case <-c.Context().Done():
			return
		}
		s.began = s.arrived
		c.execute(s)
		c.t.end()
	}
}

// onRecv handles one received message (completion handler): it checks it,
// reposts the receive, then advances the slot's exchange. An error is a
// protocol violation.
func (c *conn) onRecv(wc *rnic.WC) error {
	m, err := blockproto.ParseCommand(c.Received(wc))
	if err != nil {
		return fmt.Errorf("message on QP after login: %w", err)
	}
	var cmd [blockproto.CommandLen]byte
	copy(cmd[:], m)
	if err := c.Repost(int(wc.ID)); err != nil {
		c.markDead()
		return nil
	}
	m = cmd[:]
	k := int(m.Tag() & 0xFFFF)
	if k >= len(c.slots) {
		return fmt.Errorf("%s with slot %d, credits %d", m.Op(), k, len(c.slots))
	}
	s := &c.slots[k]
	stag := rnic.STag(m.STag())
	invalidated := wc.HasInvalidated && wc.Invalidated == stag
	if wc.HasInvalidated && !invalidated {
		return fmt.Errorf("%s invalidated STag %s but names %s", m.Op(), wc.Invalidated, stag)
	}
	s.mu.Lock()
	switch m.Op() {
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
			if err := c.answerSent(s, m); err != nil {
				s.mu.Unlock()
				return err
			}
			g := c.grants.consume(stag)
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
			return fmt.Errorf("%s sent with Invalidate", m.Op())
		}
		if s.state != slotFree {
			st := s.state
			s.mu.Unlock()
			return fmt.Errorf("%s on busy slot %d (state %d)", m.Op(), k, st)
		}
		if err := c.answerSent(s, m); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	s.state = slotBusy
	s.cmd = cmd
	s.arrived = time.Now()
	s.mu.Unlock()
	if !c.t.begin() {
		return nil // draining: no answer; GOODBYE follows and the initiator replays
	}
	if c.runsHere(s) {
		s.began = s.arrived
		c.execute(s)
		c.t.end()
		return nil
	}
	if c.readHere(s) || c.writeHere(s) {
		c.t.end()
		return nil
	}
	s.wake <- struct{}{}
	return nil
}

// answerSent checks that the transmitter has gathered the slot's last
// answer before the slot takes command m (s.mu held): an initiator cannot
// have an answer that has not left, so a command before it is a
// violation, and the answer's bytes, which the command would rewrite,
// are read no more.
func (c *conn) answerSent(s *slot, m blockproto.Command) error {
	if s.ans.Marked() && !c.QP.SendGathered(&s.ans, s.ansLast) {
		return fmt.Errorf("%s on slot %d before the slot's last answer was sent", m.Op(), s.idx)
	}
	return nil
}

// maxHere is the largest command the completion handler runs itself.
const maxHere = 64 << 10

// runsHere reports whether the completion handler runs the slot's command itself
// instead of waking the slot's worker: an inline READ or a granted WRITE,
// of whole blocks and at most maxHere bytes, on a volume in memory. Such a
// command only copies memory and posts Sends: it takes no pooled buffer
// (a buffer could wait for a RELEASE that only this handler can see) and
// waits for no I/O, and a burst of them then leaves in one write.
func (c *conn) runsHere(s *slot) bool {
	m := blockproto.Command(s.cmd[:])
	off, n := m.Offset(), m.Length()
	if n > maxHere || off%blk != 0 || n%blk != 0 || !c.sess.vol.v.InMemory() {
		return false
	}
	switch m.Op() {
	case blockproto.OpRead:
		return m.Inline()
	case blockproto.OpWrite:
		return s.grant != nil
	}
	return false
}

// readHere answers an inline READ of whole blocks from the completion
// handler when the store has them at hand (TryReadBlocks: in memory or in
// the page cache, no lock to wait for), saving the hand-off to the slot's
// worker. It reports false, having answered nothing, otherwise; the
// worker then runs the READ as usual.
func (c *conn) readHere(s *slot) bool {
	m := blockproto.Command(s.cmd[:])
	off, n := m.Offset(), m.Length()
	if m.Op() != blockproto.OpRead || !m.Inline() || n == 0 || off%blk != 0 || n%blk != 0 || int(n) > c.inline ||
		c.checkIO(off, n, c.t.cfg.MaxTransfer) != blockproto.StatusOK {
		return false
	}
	area := c.dataArea(s.idx)
	if !c.sess.vol.v.TryReadBlocks(off/blk, area[blockproto.DataFixedLen:][:n]) {
		return false
	}
	s.began = s.arrived
	c.t.m.ReadsHere.Add(1)
	c.sendInlineRead(s, area, n)
	return true
}

// writeHere runs a granted WRITE of whole blocks from the completion
// handler when nothing it needs is held by anyone else and the store can
// write the blocks without a copy or a wait (TryWriteBlocks: clusters the
// volume alone holds or new ones, into the page cache), saving the
// hand-off to the slot's worker and back (a third of rtarget's CPU per
// 4 KiB write on the thin store). It reports false, having changed
// nothing, otherwise; the worker then runs the WRITE as usual, and answers
// the refusals (reservations, fencing tokens, ranges) itself. FUA writes
// wait for a commit: always the worker.
func (c *conn) writeHere(s *slot) bool {
	m := blockproto.Command(s.cmd[:])
	off, n := m.Offset(), m.Length()
	g := s.grant
	if m.Op() != blockproto.OpWrite || g == nil || m.FUA() || n == 0 || n > maxHere || int(n) > len(g.buf) ||
		g.mr.Placed() < uint64(n) || off%blk != 0 || n%blk != 0 ||
		c.checkIO(off, n, c.t.cfg.MaxTransfer) != blockproto.StatusOK {
		return false
	}
	vol := c.sess.vol
	if !vol.fence.TryRLock() {
		return false
	}
	defer vol.fence.RUnlock()
	if vol.checkMutation(c.sess.slot, m.Token()).status != blockproto.StatusOK {
		return false
	}
	r, ok := vol.tryLockBlocks(off/blk, uint64(n)/blk)
	if !ok {
		return false
	}
	wrote := vol.v.TryWriteBlocks(off/blk, g.buf[:n])
	r.unlock()
	if !wrote {
		return false
	}
	s.grant = nil
	c.grants.putIdle(g) // before the answer, which advertises it again
	c.t.m.WritesHere.Add(1)
	c.t.m.BytesWrit.Add(uint64(n))
	s.began = s.arrived
	c.t.m.done(OpWrite, s.began, false)
	c.answer(s, blockproto.StatusOK, 0, "")
	return true
}

// endExchangeLocked returns the exchange's buffer and frees the slot.
func (s *slot) endExchangeLocked() {
	s.lease.Stop()
	s.c.t.pool.Put(s.buf)
	s.buf = nil
	s.state = slotFree
}

// armLeaseLocked starts the lease of a buffer just advertised.
func (s *slot) armLeaseLocked() {
	s.deadline = time.Now().Add(s.c.t.cfg.ReadLease)
	s.lease.Reset(s.c.t.cfg.ReadLease)
}

// expire revokes the buffer STag of an exchange whose lease ran out. The
// buffer itself is kept until RELEASE (or teardown): a Read Response may
// still be leaving it.
//
// The READY's Fast-Register is a work request: behind a stalled send
// queue (an initiator that stopped reading) it may not have run yet, and
// would make the STag valid after an Invalidate of the region alone, until
// the RELEASE. So the STag is invalidated at once (for a Fast-Register
// done) and by a Local Invalidate work request too, which the send queue
// runs after the Fast-Register (ready arms the lease once that is posted).
func (s *slot) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != slotAwaitRelease && s.state != slotAwaitWrite || time.Now().Before(s.deadline) {
		return
	}
	if err := s.mr.Invalidate(); err != nil {
		s.c.log.Warn("revoking an expired buffer", "slot", s.idx, "err", err)
		return
	}
	if _, err := s.c.QP.PostSend(rnic.SendWR{Op: rnic.WRInvalidate, Unsignaled: true, InvalidateSTag: s.stag}); err != nil {
		if !s.c.isDead() {
			s.c.log.Warn("revoking an expired buffer", "slot", s.idx, "err", err)
		}
		s.c.markDead()
		return
	}
	s.c.t.m.LeaseExpired.Add(1)
	s.c.log.Info("buffer lease expired: STag revoked", "qp", s.c.QP.ID(), "slot", s.idx, "stag", s.stag)
}

// release returns the slot's buffer and grant at teardown (the endpoint
// frees its STag).
func (s *slot) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease != nil {
		s.lease.Stop()
	}
	s.state = slotFree // a lease timer firing now finds nothing to revoke
	s.c.t.pool.Put(s.buf)
	s.buf = nil
	if s.grant != nil {
		s.c.grants.putIdle(s.grant)
		s.grant = nil
	}
}
