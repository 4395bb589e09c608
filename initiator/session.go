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

	pd     *rnic.PD
	qps    []*iqp
	bounce *bouncePool
	rr     atomic.Uint32

	goodbyes atomic.Int32 // QPs that received a synced GOODBYE

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
			// The QPs logged in so far have no poller yet (they get
			// one once every QP joined), so close, which waits for the
			// pollers, would wait forever: stop and free them here.
			for _, q := range s.qps {
				q.stop()
				q.release()
			}
			s.qps = nil
			s.close()
			return nil, err
		}
		s.qps = append(s.qps, q)
	}
	s.bounce = newBouncePool(s.pd, s.maxTransfer, c.cfg.BounceBytes)
	for _, q := range s.qps {
		go q.poll()
	}
	if c.cfg.HeartbeatInterval > 0 && s.lockSTag != 0 {
		go s.heartbeat(c.cfg.HeartbeatInterval, c.cfg.HeartbeatTimeout)
	}
	return s, nil
}

// loginQP creates a QP and logs it in, asking for inline reads unless
// the configuration or an earlier refusal says not to. A target that
// predates inline reads refuses such a LOGIN as malformed
// (StatusProtocol): then it logs in again without asking, and the client
// does not ask again.
func (s *session) loginQP(ctx context.Context, join bool) (*iqp, error) {
	c := s.c
	for {
		inline := max(c.cfg.InlineRead, 0)
		if c.noInline.Load() {
			inline = 0
		}
		q, err := s.newIQP(c.cfg.QueueDepth, inline)
		if err != nil {
			return nil, err
		}
		err = q.login(ctx, join)
		if err == nil {
			return q, nil
		}
		q.stop()
		q.release()
		var le *LoginError
		if inline == 0 || !errors.As(err, &le) || le.Status != blockproto.StatusProtocol {
			return nil, err
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
func (s *session) pick(n int) *iqp {
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

// close resets every QP, waits for the pollers and frees everything.
func (s *session) close() {
	s.closeOnce.Do(func() {
		// A QP with nothing in flight is closed gracefully (its
		// connection ends with FIN, the target sees an orderly close);
		// one still busy, or one that does not get to Idle in time, is
		// reset. Either way it ends in Error, which flushes the
		// receives and so stops its poller.
		var closing []*iqp
		for _, q := range s.qps {
			if q.qp.State() != rnic.StateRTS {
				continue
			}
			if q.idle() && q.qp.Modify(rnic.StateClosing, rnic.ModifyAttrs{}) == nil {
				closing = append(closing, q)
			} else {
				q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
			}
		}
		for _, q := range closing {
			ctx, cancel := context.WithTimeout(context.Background(), gracefulClose)
			q.qp.WaitState(ctx, rnic.StateIdle, rnic.StateError)
			cancel()
			if st := q.qp.State(); st == rnic.StateIdle || st == rnic.StateRTS || st == rnic.StateClosing {
				q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
			}
		}
		for _, q := range s.qps {
			<-q.done
			q.release()
		}
		if s.bounce != nil {
			s.bounce.close()
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
	if synced && int(s.goodbyes.Add(1)) == len(s.qps) {
		s.c.unflushed.CompareAndSwap(s.bootID, 0)
	}
}

// do runs one exchange on a slot of some QP. A WRITE's data comes from
// src, a READ's goes to dst, both through a staging buffer.
func (s *session) do(ctx context.Context, op blockproto.Opcode, flags uint16, off uint64, n uint32, token uint64,
	src, dst []byte) (result, error) {
	var b *bbuf
	if src != nil || dst != nil {
		var err error
		if b, err = s.bounce.get(ctx, int(n)); err != nil {
			return result{}, err
		}
		if src != nil {
			copy(b.b, src)
		}
	}
	q := s.pick(int(n))
	sl, err := q.acquire(ctx)
	if err != nil {
		s.bounce.put(b)
		return result{}, err
	}
	sl.op, sl.flags, sl.off, sl.n, sl.token, sl.bounce = op, flags, off, n, token, b
	keep, res, err := sl.run(ctx)
	if !keep {
		return res, err // the poller returns b when the exchange ends
	}
	if err == nil && dst != nil {
		copy(dst, b.b[:n])
	}
	s.bounce.put(b)
	return res, err
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
		return 0, errConnLost
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	wr := rnic.SendWR{ID: idAtom | uint64(k), Op: op, Local: rnic.SGE{STag: q.atomMR.STag(), TO: uint64(k * 8), Len: 8},
		Remote: rnic.RemoteAddr{STag: q.lockSTag, TO: s.lockTO + off}, AddSwap: swapAdd}
	if op == rnic.WRCmpSwap {
		wr.Compare, wr.CompareMask, wr.AddSwapMask = compare, ^uint64(0), ^uint64(0)
	}
	if _, err := q.qp.PostSend(wr); err != nil {
		return 0, errConnLost
	}
	// An atomic is not abandoned on ctx: it completes or the QP dies.
	select {
	case st := <-q.atoms[k].done:
		if st != rnic.StatusSuccess {
			return 0, errConnLost
		}
	case <-q.dead:
		return 0, errConnLost
	}
	v := nativeUint64(q.atomBuf[k*8:])
	q.afree <- k
	return v, nil
}

// holderName asks the target who holds reservation slot i.
func (s *session) holderName(ctx context.Context, i uint8) (string, error) {
	res, err := s.do(ctx, blockproto.OpHolder, 0, uint64(i), 0, 0, nil, nil)
	return res.detail, err
}
