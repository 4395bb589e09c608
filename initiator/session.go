package initiator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// session is one login to the volume: a protection domain, the QPs that
// joined it and the geometry the WELCOME announced.
type session struct {
	c     *Client
	epoch uint64 // counts the client's sessions
	addr  string // the target it logged in to

	id          uint64
	bootID      uint64
	size        int64
	slot        uint8
	maxTransfer int
	grantSize   int
	readOnly    bool
	lockSTag    rnic.STag
	lockTO      uint64
	lockCount   uint32
	// noHole: every QP's WELCOME granted WRITE_ZEROES with FlagNoHole.
	noHole bool

	pd  *rnic.PD
	qps []*conn
	rr  atomic.Uint32

	goodbyes atomic.Int32 // QPs that received a synced GOODBYE
	// leaving is set by the first GOODBYE: the target is closing every
	// QP of the session, so close leaves the closing to it.
	leaving atomic.Bool

	dead      chan struct{}
	failOnce  sync.Once
	closeOnce sync.Once
	cause     error
}

// dial logs in a new session with cfg.QPs QPs at addr.
func (c *Client) dial(ctx context.Context, epoch uint64, addr string) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LoginTimeout)
	defer cancel()
	s := &session{c: c, epoch: epoch, addr: addr, dead: make(chan struct{})}
	var err error
	if s.pd, err = c.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("initiator: allocate PD: %w", err)
	}
	for i := 0; i < c.cfg.QPs; i++ {
		q, err := s.loginQP(ctx, i > 0)
		if err != nil {
			// The QPs logged in so far have no completion loop yet
			// (they get one once every QP joined): free them here.
			for _, q := range s.qps {
				q.Endpoint.Close(nil)
			}
			s.qps = nil
			s.close()
			return nil, err
		}
		s.qps = append(s.qps, q)
	}
	s.noHole = true
	for _, q := range s.qps {
		s.noHole = s.noHole && q.noHole
	}
	for _, q := range s.qps {
		q.Start(q.handle)
	}
	if c.cfg.HeartbeatInterval > 0 && s.lockSTag != 0 {
		go s.heartbeat(c.cfg.HeartbeatInterval, c.cfg.HeartbeatTimeout)
	}
	if c.dialed != nil {
		c.dialed(s)
	}
	return s, nil
}

// loginQP creates a QP and logs it in, asking for WRITE_ZEROES with
// FlagNoHole, BLOCK_STATUS and inline reads unless the configuration or an
// earlier refusal says not to. A target that predates one of them refuses
// such a LOGIN as malformed (StatusProtocol): then it logs in again
// without the newest one asked for (FlagNoHole, then BLOCK_STATUS, then
// inline reads), and the client does not ask for it again.
func (s *session) loginQP(ctx context.Context, join bool) (*conn, error) {
	c := s.c
	for {
		inline := max(c.cfg.InlineRead, 0)
		if c.noInline.Load() {
			inline = 0
		}
		q, err := s.newConn(c.cfg.QueueDepth, inline)
		if err != nil {
			return nil, err
		}
		q.askExtents = !c.noExtents.Load()
		q.askNoHole = !c.noNoHole.Load()
		err = q.login(ctx, join)
		if err == nil {
			return q, nil
		}
		q.Endpoint.Close(nil)
		var le *LoginError
		if (inline == 0 && !q.askExtents && !q.askNoHole) || !errors.As(err, &le) || le.Status != blockproto.StatusProtocol {
			return nil, err
		}
		if q.askNoHole {
			c.log.Info("the target refused a LOGIN asking for WRITE_ZEROES without holes: logging in without it "+
				"(such zeroes are written as data)", "err", err)
			c.noNoHole.Store(true)
			continue
		}
		if q.askExtents {
			c.log.Info("the target refused a LOGIN asking for BLOCK_STATUS: logging in without it", "err", err)
			c.noExtents.Store(true)
			continue
		}
		c.log.Info("the target refused a LOGIN asking for inline reads: logging in without them", "err", err)
		c.noInline.Store(true)
	}
}

// pick returns a QP for a request of n bytes: one with a free slot if
// there is one, else the next in turn. Small requests fill the first QP
// before the next: on one connection they share writes and wake-ups.
// Large ones take the QPs in turn: their bytes then move over several
// connections at once.
func (s *session) pick(n int) *conn {
	k := uint32(len(s.qps))
	start := uint32(0)
	if n > pickSpread {
		start = s.rr.Add(1)
	}
	for i := uint32(0); i < k; i++ {
		q := s.qps[(start+i)%k]
		if len(q.free) > 0 && !q.isDead() {
			return q
		}
	}
	return s.qps[s.rr.Add(1)%k]
}

// pickSpread is the request size above which pick spreads requests over
// the QPs.
const pickSpread = 64 << 10

// fail marks the session dead (a QP died) and lets the client reconnect.
func (s *session) fail(cause error) {
	s.failOnce.Do(func() {
		s.cause = cause
		close(s.dead)
		s.c.lost(s)
	})
}

func (s *session) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

// close ends every QP, waits until each is stopped (its exchanges in
// flight failed) and frees the session's protection domain.
func (s *session) close() {
	s.closeOnce.Do(func() {
		// A QP with nothing in flight is closed gracefully (its
		// connection ends with FIN, the target sees an orderly close);
		// one still busy, or one that does not get to Idle in time, is
		// reset. When the target is leaving (a GOODBYE came), every QP
		// waits for its own GOODBYE and FIN, busy or not: the target
		// has drained and sends one on each, and a command it got while
		// draining, which it leaves unanswered for the next session to
		// replay, keeps its QP busy; resetting that QP lost its GOODBYE,
		// and with it the news that the writes were synced (a Flush
		// waiting for that then waited for a target that was gone).
		// Either way it ends in Error or Idle, which flushes the
		// receives: the handler sees that and stops the QP. The QPs that
		// joined go first and the login's QP last: the target ends the
		// session when that one closes, and resets the QPs still open
		// then, which would end them with a reset where an orderly close
		// was meant.
		var wg sync.WaitGroup
		closeQPs := func(qps []*conn) {
			for _, q := range qps {
				if !q.idle() && !s.leaving.Load() {
					q.Reset()
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if s.leaving.Load() {
						// Its GOODBYE and FIN may still be on the way: a
						// FIN of ours crossing the GOODBYE would make it
						// a segment received while closing, a reset.
						q.AwaitClose(gracefulClose)
					} else {
						q.CloseGracefully(gracefulClose)
					}
				}()
			}
			wg.Wait()
		}
		if len(s.qps) > 0 {
			closeQPs(s.qps[1:])
			closeQPs(s.qps[:1])
		}
		for _, q := range s.qps {
			<-q.stopped
		}
		if s.pd != nil {
			if err := s.pd.Dealloc(); err != nil {
				s.c.log.Debug("deallocating the session PD", "err", err)
			}
		}
	})
}

// gracefulClose bounds the wait for an orderly close of a session's QP.
const gracefulClose = 2 * time.Second

// onGoodbye records a GOODBYE: once every QP got a synced one, every
// write this session acknowledged is durable.
func (s *session) onGoodbye(synced bool) {
	s.leaving.Store(true)
	if synced && int(s.goodbyes.Add(1)) == len(s.qps) && s.c.unflushed.CompareAndSwap(s.bootID, 0) {
		s.c.wake() // a Flush waiting for the next session may be done
	}
}

// do runs one exchange on a slot of some QP and waits for its outcome. A
// READ's data goes to p, a WRITE's comes from p: the RNIC reaches p only
// while the exchange maps it under the slot's STag, and do does not
// return while it does.
func (s *session) do(ctx context.Context, op blockproto.Opcode, flags uint16, off uint64, n uint32, token uint64,
	p []byte) (result, error) {
	sl, err := s.pick(int(n)).acquire(ctx)
	if err != nil {
		return result{}, err
	}
	sl.op, sl.flags, sl.off, sl.n, sl.token, sl.p = op, flags, off, n, token, p
	return sl.run(ctx)
}

// atomic runs an RFC 7306 atomic on word off (bytes from the table's
// start) of the lock table and returns the word's original value.
func (s *session) atomic(ctx context.Context, op rnic.WROp, off uint64, compare, swapAdd uint64) (uint64, error) {
	if s.lockSTag == 0 {
		return 0, fmt.Errorf("%w: the target offers no lock table", ErrInvalid)
	}
	q := s.pick(0)
	var k int
	select {
	case k = <-q.afree:
	case <-q.dead:
		return 0, q.cause
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	wr := rnic.SendWR{ID: idAtom | uint64(k), Op: op, Local: rnic.SGE{STag: q.atomMR.STag(), TO: uint64(k * 8), Len: 8},
		Remote: rnic.RemoteAddr{STag: q.lockSTag, TO: s.lockTO + off}, AddSwap: swapAdd}
	if op == rnic.WRCmpSwap {
		wr.Compare, wr.CompareMask, wr.AddSwapMask = compare, ^uint64(0), ^uint64(0)
	}
	if _, err := q.QP.PostSend(wr); err != nil {
		// The QP is going away: whatever killed it is the cause.
		q.die(fmt.Errorf("%w: QP %d: posting an atomic: %w", errConnLost, q.QP.ID(), err))
		return 0, q.cause
	}
	// An atomic is not abandoned on ctx: it completes or the QP dies (a
	// failed completion kills it before it reaches done: dispatch).
	select {
	case <-q.atoms[k].done:
	case <-q.dead:
		return 0, q.cause
	}
	v := nativeUint64(q.atomBuf[k*8:])
	q.afree <- k
	return v, nil
}

// holderName asks the target who holds reservation slot i.
func (s *session) holderName(ctx context.Context, i uint8) (string, error) {
	res, err := s.do(ctx, blockproto.OpHolder, 0, uint64(i), 0, 0, nil)
	return res.detail, err
}
