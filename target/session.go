package target

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
)

// session is one initiator's login to one volume: a reservation slot and
// the QPs that joined it. Any of its QPs failing ends the whole session.
type session struct {
	t    *Target
	id   uint64
	name string // initiator
	vol  *volume
	slot uint8

	mu      sync.Mutex
	qps     []*conn
	ended   bool
	endOnce sync.Once
	// closing is set when the target itself closes the session's QPs in
	// order (goodbye): their end is then not the initiator's doing.
	closing atomic.Bool
}

// addSession gives s an unused random ID and registers it with the
// target (false once the target is closed: s is not registered).
func (t *Target) addSession(s *session) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	for s.id == 0 || t.sessions[s.id] != nil {
		var b [8]byte
		rand.Read(b[:])
		s.id = binary.LittleEndian.Uint64(b[:])
	}
	t.sessions[s.id] = s
	t.mu.Unlock()
	t.m.SessionsActive.Add(1)
	t.m.SessionsTotal.Add(1)
	return true
}

// isEnded reports whether end has begun.
func (s *session) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// addQP adds a logged-in QP; false if the session ended or is full. The
// QP counts in QPsActive from here until end, which subtracts every QP
// the session holds, whether or not its login went on to the WELCOME.
func (s *session) addQP(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || len(s.qps) >= s.t.cfg.MaxQPsPerSession {
		return false
	}
	s.qps = append(s.qps, c)
	c.sess = s
	c.inSession.Store(true)
	s.t.m.QPsActive.Add(1)
	return true
}

// startQP starts a logged-in QP's completion loop and workers, unless the
// session ended meanwhile (end then tears c down; it must not race with
// the start, whose WaitGroup.Add it waits on).
func (s *session) startQP(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		c.start()
	}
}

// reasonInitiatorClosed is the reason a session ends when its initiator
// closed one of its QPs in order.
const reasonInitiatorClosed = "initiator closed the connection"

// closeWait bounds the orderly close of a session's QPs when it ends in
// order.
const closeWait = time.Second

// end tears the session down: every QP, then the locks and reservation
// it held (bumping the fence), its slot, its volume reference; last, it
// takes the session out of the target's table.
func (s *session) end(reason string) {
	s.endOnce.Do(func() {
		t := s.t
		s.mu.Lock()
		s.ended = true
		qps := s.qps
		s.mu.Unlock()
		// When the initiator closed a QP in order, it is leaving, and
		// after a goodbye the target is: the QPs are closed in order
		// (FIN both ways, not a reset, which the initiator's engine
		// would report as a lost stream), within closeWait.
		graceful := reason == reasonInitiatorClosed || s.closing.Load()
		var wg sync.WaitGroup
		for _, c := range qps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if graceful {
					c.CloseGracefully(closeWait)
				}
				c.down()
			}()
		}
		wg.Wait()
		t.m.QPsActive.Add(-int64(len(qps)))
		cleared := s.vol.releaseSlot(s.slot)
		t.m.LocksCleared.Add(uint64(cleared))
		t.releaseVolume(s.vol)
		t.m.SessionsActive.Add(-1)
		// The session leaves the table only now: Shutdown ends what it
		// finds there, and its end (endOnce) then waits for a teardown
		// already under way, so that Shutdown returns only once every
		// QP, CQ and PD is released and the volume reference dropped
		// (the caller closes the device and the store next).
		t.mu.Lock()
		delete(t.sessions, s.id)
		t.mu.Unlock()
		t.log.Info("session ended", "session", s.id, "initiator", s.name, "volume", s.vol.name, "reason", reason,
			"locks_cleared", cleared)
	})
}

// goodbye says GOODBYE on every QP (Shutdown, after the drain and flush)
// and closes them gracefully.
func (s *session) goodbye(ctx context.Context, synced bool) {
	s.mu.Lock()
	if s.ended {
		// Ending already (its initiator went away): end closes its QPs.
		s.mu.Unlock()
		return
	}
	qps := append([]*conn(nil), s.qps...)
	s.mu.Unlock()
	s.closing.Store(true)
	detail := "target shutting down; acknowledged writes are durable"
	if !synced {
		detail = "target shutting down"
	}
	var wg sync.WaitGroup
	for _, c := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.sayGoodbye(ctx, synced, detail)
		}()
	}
	wg.Wait()
}
