package rnic

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// QPState is a queue pair state (draft §6.2).
type QPState uint8

const (
	StateIdle QPState = iota
	StateRTS
	StateClosing
	StateTerminate
	StateError
)

func (s QPState) String() string {
	return [...]string{"Idle", "RTS", "Closing", "Terminate", "Error"}[s]
}

// QPConfig are the attributes of Create QP (draft §6.1.1).
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // receives come from this S-RQ; RQDepth and MaxRecvSGE are then ignored
	SQDepth        int
	RQDepth        int
	MaxSendSGE     int
	MaxWriteSGE    int
	MaxRecvSGE     int
	IRD, ORD       int
	// Inbound operations the peer may perform on this QP.
	InboundRead   bool
	InboundWrite  bool // also needed to receive RDMA Read Responses
	InboundAtomic bool // RFC 7306 atomics
	BindMW        bool
	// Privileged enables Fast-Register (and STag 0, which this RNIC never
	// accepts remotely).
	Privileged bool
	// RQLimit arms the QP RQ Limit event (QPs on an S-RQ).
	RQLimit int
}

// QPInfo is what Query QP returns.
type QPInfo struct {
	ID       uint32
	State    QPState
	PD       uint32
	Config   QPConfig
	IRD, ORD int
	// Terminate is the Terminate message sent or received on the stream
	// (in Terminate and Error states); TerminateSent says which: generated
	// here and sent, or received from the peer.
	Terminate     *rdmap.TerminateFields
	TerminateSent bool
	Stream        *StreamInfo // when not Idle
	// RQLimit and RQLimitArmed are the QP RQ Limit and whether its event
	// is armed (QPs on an S-RQ, draft §9.2.5.2).
	RQLimit      int
	RQLimitArmed bool
}

// QP is a queue pair handle.
type QP struct {
	dev *Device
	pd  *PD
	id  uint32
	cfg QPConfig

	sq *sendQueue
	rq *recvQueue // nil with an S-RQ

	mu        sync.Mutex
	state     QPState
	conn      *conn
	term      *rdmap.TerminateFields // sent or received (termSent)
	termSent  bool
	ird, ord  int
	destroyed bool
	changed   chan struct{} // closed at every state change
	rqLimit   int
	rqArmed   bool

	// srqHeld counts the S-RQ WQEs this QP has taken whose Work Completion
	// has not been retrieved yet: its messages "in progress" for the QP RQ
	// Limit (draft §6.3.8, read with §6.3.7).
	srqHeld atomic.Int32

	mwBound atomic.Int32
	plugs   atomic.Int32  // Plug nesting: posting does not start transmission
	stateA  atomic.Uint32 // mirror of state for the data path
	ordA    atomic.Int32  // mirror of ord for the transmitter
}

func (qp *QP) loadState() QPState { return QPState(qp.stateA.Load()) }

func (qp *QP) currentORD() int { return int(qp.ordA.Load()) }

// withDefaults returns cfg with its zero sizes filled in: SQ and RQ depths
// of 128 (no RQ on an S-RQ) and 4 SGEs per WR, or the device's limit if it
// is lower.
func (cfg QPConfig) withDefaults(c *Config) QPConfig {
	if cfg.SQDepth <= 0 {
		cfg.SQDepth = 128
	}
	if cfg.SRQ == nil && cfg.RQDepth <= 0 {
		cfg.RQDepth = 128
	}
	for _, v := range []struct {
		n   *int
		lim int
	}{{&cfg.MaxSendSGE, c.MaxSGE}, {&cfg.MaxWriteSGE, c.MaxWriteSGE}, {&cfg.MaxRecvSGE, c.MaxSGE}} {
		if *v.n <= 0 {
			*v.n = min(4, v.lim)
		}
	}
	return cfg
}

// validate checks a QP's attributes (defaults applied) against device d
// and its limits (draft §6.1.1).
func (cfg QPConfig) validate(d *Device) error {
	c := &d.cfg
	switch {
	case cfg.SendCQ == nil || cfg.RecvCQ == nil:
		return fmt.Errorf("%w: send and receive CQs are required", ErrInvalidCQ)
	case cfg.SQDepth > c.MaxWR:
		return fmt.Errorf("%w: SQ depth %d", ErrWRExceedsCapability, cfg.SQDepth)
	case cfg.SRQ == nil && cfg.RQDepth > c.MaxWR:
		return fmt.Errorf("%w: RQ depth %d", ErrWRExceedsCapability, cfg.RQDepth)
	case cfg.SRQ != nil && cfg.SRQ.dev != d:
		return ErrInvalidSRQ
	case cfg.MaxSendSGE > c.MaxSGE:
		return fmt.Errorf("%w: %d send SGEs > %d", ErrSGEExceedsCapability, cfg.MaxSendSGE, c.MaxSGE)
	case cfg.MaxWriteSGE > c.MaxWriteSGE:
		return fmt.Errorf("%w: %d RDMA Write SGEs > %d", ErrSGEExceedsCapability, cfg.MaxWriteSGE, c.MaxWriteSGE)
	case cfg.MaxRecvSGE > c.MaxSGE:
		return fmt.Errorf("%w: %d receive SGEs > %d", ErrSGEExceedsCapability, cfg.MaxRecvSGE, c.MaxSGE)
	case cfg.IRD < 0 || cfg.IRD > c.MaxIRD:
		return fmt.Errorf("%w: %d", ErrIRDExceedsCapability, cfg.IRD)
	case cfg.ORD < 0 || cfg.ORD > c.MaxORD:
		return fmt.Errorf("%w: %d", ErrORDExceedsCapability, cfg.ORD)
	case cfg.RQLimit < 0 || (cfg.SRQ != nil && cfg.RQLimit > cfg.SRQ.q.depth):
		return ErrRQLimit
	}
	return nil
}

// CreateQP creates a queue pair in the Idle state.
func (pd *PD) CreateQP(cfg QPConfig) (*QP, error) {
	d := pd.dev
	c := d.cfg
	cfg = cfg.withDefaults(&c)
	if err := cfg.validate(d); err != nil {
		return nil, fmt.Errorf("rnic: create QP: %w", err)
	}
	if err := cfg.SendCQ.use(1); err != nil {
		return nil, fmt.Errorf("rnic: create QP: send CQ: %w", err)
	}
	if err := cfg.RecvCQ.use(1); err != nil {
		cfg.SendCQ.use(-1)
		return nil, fmt.Errorf("rnic: create QP: receive CQ: %w", err)
	}
	undo := func() { cfg.SendCQ.use(-1); cfg.RecvCQ.use(-1) }
	if cfg.SRQ != nil {
		cfg.SRQ.mu.Lock()
		if cfg.SRQ.dead {
			cfg.SRQ.mu.Unlock()
			undo()
			return nil, fmt.Errorf("rnic: create QP: %w", ErrInvalidSRQ)
		}
		cfg.SRQ.users++
		cfg.SRQ.mu.Unlock()
	}
	if err := pd.ref(); err != nil {
		undo()
		if cfg.SRQ != nil {
			cfg.SRQ.mu.Lock()
			cfg.SRQ.users--
			cfg.SRQ.mu.Unlock()
		}
		return nil, fmt.Errorf("rnic: create QP: %w", err)
	}
	qp := &QP{dev: d, pd: pd, cfg: cfg, ird: cfg.IRD, ord: cfg.ORD, changed: make(chan struct{}),
		sq: newSendQueue(cfg.SQDepth, cfg.MaxSendSGE, cfg.MaxWriteSGE), rqLimit: cfg.RQLimit, rqArmed: cfg.RQLimit > 0}
	qp.ordA.Store(int32(cfg.ORD))
	if cfg.SRQ == nil {
		qp.rq = newRecvQueue(cfg.RQDepth, cfg.MaxRecvSGE)
	}
	d.mu.Lock()
	if len(d.qps) >= c.MaxQP || d.closed {
		d.mu.Unlock()
		qp.release()
		return nil, fmt.Errorf("rnic: create QP: %w", ErrInsufficientResources)
	}
	for {
		d.nextQPID++
		if d.nextQPID == 0 {
			continue
		}
		if _, used := d.qps[d.nextQPID]; !used {
			break
		}
	}
	qp.id = d.nextQPID
	d.qps[qp.id] = qp
	d.mu.Unlock()
	return qp, nil
}

func (qp *QP) release() {
	qp.cfg.SendCQ.use(-1)
	qp.cfg.RecvCQ.use(-1)
	if s := qp.cfg.SRQ; s != nil {
		s.mu.Lock()
		s.users--
		s.mu.Unlock()
	}
	qp.pd.unref()
}

// ID is the QP's identifier, unique within its device.
func (qp *QP) ID() uint32 { return qp.id }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// Device returns the QP's device.
func (qp *QP) Device() *Device { return qp.dev }

// State returns the current state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Query returns the QP's attributes and state.
func (qp *QP) Query() QPInfo {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	info := QPInfo{ID: qp.id, State: qp.state, PD: qp.pd.id, Config: qp.cfg, IRD: qp.ird, ORD: qp.ord}
	if qp.cfg.SRQ != nil {
		info.RQLimit, info.RQLimitArmed = qp.rqLimit, qp.rqArmed
	}
	if qp.state == StateTerminate || qp.state == StateError {
		info.Terminate, info.TerminateSent = qp.term, qp.termSent
	}
	if qp.conn != nil {
		si := qp.conn.info
		info.Stream = &si
	}
	info.Config.SQDepth = qp.sq.depth
	if qp.rq != nil {
		info.Config.RQDepth = qp.rq.depth
	}
	return info
}

// WaitState blocks until the QP is in state s, or in one of the others
// given, or ctx ends (a non-verbs helper, draft C15 #7: the way to wait for
// Error or Idle).
func (qp *QP) WaitState(ctx context.Context, s QPState, or ...QPState) error {
	for {
		qp.mu.Lock()
		st, ch := qp.state, qp.changed
		qp.mu.Unlock()
		if st == s || slices.Contains(or, st) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("rnic: QP %d waiting for %s (now %s): %w", qp.id, s, st, ctx.Err())
		}
	}
}

// setStateLocked changes state and wakes WaitState callers. qp.mu held.
func (qp *QP) setStateLocked(s QPState) {
	if qp.state == s {
		return
	}
	qp.dev.log.Debug("QP state", "qp", qp.id, "from", qp.state, "to", s)
	qp.state = s
	qp.stateA.Store(uint32(s))
	close(qp.changed)
	qp.changed = make(chan struct{})
}

// ModifyAttrs are the optional attributes of Modify QP.
type ModifyAttrs struct {
	IRD, ORD         int // 0: unchanged
	SQDepth, RQDepth int // 0: unchanged
	RQLimit          int
	ArmRQLimit       bool
}

// Modify changes the QP's state and attributes (draft §6.1.3). Moving to
// RTS needs a stream: use Attach (or the connection manager). On any error
// the QP is unchanged.
func (qp *QP) Modify(next QPState, a ModifyAttrs) error {
	qp.mu.Lock()
	cur := qp.state
	if qp.destroyed {
		qp.mu.Unlock()
		return fmt.Errorf("rnic: modify QP: %w", ErrInvalidQP)
	}
	if err := qp.checkAttrsLocked(cur, next, &a); err != nil {
		qp.mu.Unlock()
		return err
	}
	switch {
	case cur == next && (cur == StateIdle || cur == StateRTS):
		err := qp.applyAttrsLocked(&a)
		qp.mu.Unlock()
		return err
	case cur == StateIdle && next == StateError:
		qp.flush() // under qp.mu: no WR can be posted in between
		qp.setStateLocked(StateError)
		qp.mu.Unlock()
		return nil
	case cur == StateIdle && next == StateRTS:
		qp.mu.Unlock()
		return fmt.Errorf("rnic: modify QP %d to RTS: %w: use Attach or the connection manager", qp.id, ErrInvalidStream)
	case cur == StateRTS && next == StateClosing:
		c := qp.conn
		qp.mu.Unlock()
		c.closeGracefully()
		return nil
	case cur == StateRTS && next == StateTerminate:
		c := qp.conn
		qp.mu.Unlock()
		c.terminateLocal()
		return nil
	case cur == StateRTS && next == StateError:
		c := qp.conn
		qp.mu.Unlock()
		c.abort(true)
		return nil
	case cur == StateError && next == StateIdle:
		if qp.conn != nil {
			qp.mu.Unlock()
			return fmt.Errorf("rnic: modify QP %d to Idle: %w", qp.id, ErrFlushing)
		}
		qp.setStateLocked(StateIdle)
		qp.term, qp.termSent = nil, false
		qp.mu.Unlock()
		return nil
	}
	qp.mu.Unlock()
	return fmt.Errorf("rnic: modify QP %d from %s to %s: %w", qp.id, cur, next, ErrInvalidStateChange)
}

func (qp *QP) checkAttrsLocked(cur, next QPState, a *ModifyAttrs) error {
	c := qp.dev.cfg
	attrs := a.IRD != 0 || a.ORD != 0 || a.SQDepth != 0 || a.RQDepth != 0 || a.ArmRQLimit
	if attrs && !((cur == StateIdle && (next == StateIdle || next == StateRTS)) || (cur == StateRTS && next == StateRTS)) {
		return fmt.Errorf("rnic: modify QP %d: %w in %s->%s", qp.id, ErrCannotChangeAttribute, cur, next)
	}
	if a.IRD < 0 || a.IRD > c.MaxIRD {
		return fmt.Errorf("rnic: modify QP: %w", ErrIRDExceedsCapability)
	}
	if a.ORD < 0 || a.ORD > c.MaxORD {
		return fmt.Errorf("rnic: modify QP: %w", ErrORDExceedsCapability)
	}
	if a.SQDepth < 0 || a.SQDepth > c.MaxWR || a.RQDepth < 0 || a.RQDepth > c.MaxWR {
		return fmt.Errorf("rnic: modify QP: %w", ErrWRExceedsCapability)
	}
	if a.RQDepth != 0 && qp.rq == nil {
		return fmt.Errorf("rnic: modify QP: %w: RQ depth with an S-RQ", ErrCannotChangeAttribute)
	}
	if a.ArmRQLimit && (qp.cfg.SRQ == nil || a.RQLimit < 0 || a.RQLimit > qp.cfg.SRQ.q.depth) {
		return fmt.Errorf("rnic: modify QP: %w", ErrRQLimit)
	}
	if a.SQDepth != 0 {
		qp.sq.mu.Lock()
		out := int(qp.sq.tail - qp.sq.head)
		qp.sq.mu.Unlock()
		if a.SQDepth < out {
			return fmt.Errorf("rnic: modify QP: SQ depth %d with %d outstanding: %w", a.SQDepth, out, ErrShrink)
		}
	}
	if a.RQDepth != 0 {
		qp.rq.mu.Lock()
		out := int(qp.rq.tail-qp.rq.head) + qp.rq.inProgress
		qp.rq.mu.Unlock()
		if a.RQDepth < out {
			return fmt.Errorf("rnic: modify QP: RQ depth %d with %d outstanding: %w", a.RQDepth, out, ErrShrink)
		}
	}
	return nil
}

func (qp *QP) applyAttrsLocked(a *ModifyAttrs) error {
	if a.SQDepth != 0 {
		if err := qp.sq.resize(a.SQDepth); err != nil {
			return err
		}
	}
	if a.RQDepth != 0 {
		if err := qp.rq.resize(a.RQDepth); err != nil {
			return err
		}
	}
	if a.IRD != 0 {
		qp.ird = a.IRD
	}
	if a.ORD != 0 {
		qp.ord = a.ORD
		qp.ordA.Store(int32(a.ORD))
		if qp.conn != nil {
			qp.conn.kick() // a raised ORD may unblock the transmitter
		}
	}
	if a.ArmRQLimit {
		qp.rqLimit = a.RQLimit
		qp.rqArmed = a.RQLimit > 0
	}
	return nil
}

// flush completes every outstanding WQE of the QP with Flushed (draft
// §6.2.4). qp.mu is held, so that posting (which checks the state and
// queues under qp.mu) cannot slip a WR in behind the flush.
func (qp *QP) flush() {
	qp.sq.mu.Lock()
	qp.sq.flushLocked(qp)
	qp.sq.mu.Unlock()
	if qp.rq != nil {
		qp.rq.drain(func(id uint64) {
			qp.cfg.RecvCQ.push(WC{ID: id, Op: WRRecv, Status: StatusFlushed, QPID: qp.id})
		})
	}
}

// flushRQ flushes the receive queue only (graceful close, draft T6/T16).
// The caller has moved the QP to Closing first, so posting is refused.
func (qp *QP) flushRQ() {
	if qp.rq != nil {
		qp.rq.drain(func(id uint64) {
			qp.cfg.RecvCQ.push(WC{ID: id, Op: WRRecv, Status: StatusFlushed, QPID: qp.id})
		})
	}
}

// Destroy frees the QP in any state, resetting its connection. It fails
// with ErrMWBoundToQP while windows are bound to it. Completions of WRs still
// outstanding may or may not appear on the CQs.
func (qp *QP) Destroy() error {
	if qp.mwBound.Load() > 0 {
		return fmt.Errorf("rnic: destroy QP %d: %w", qp.id, ErrMWBoundToQP)
	}
	qp.mu.Lock()
	if qp.destroyed {
		qp.mu.Unlock()
		return fmt.Errorf("rnic: destroy QP: %w", ErrInvalidQP)
	}
	qp.destroyed = true
	c := qp.conn
	qp.mu.Unlock()
	if c != nil {
		c.abort(false)
	}
	d := qp.dev
	d.mu.Lock()
	delete(d.qps, qp.id)
	d.mu.Unlock()
	qp.release()
	return nil
}

// teardown is Destroy without the bound-window check (device close). It
// returns the QP's stream, if it had one, whose goroutines are ending.
func (qp *QP) teardown() *conn {
	qp.mu.Lock()
	if qp.destroyed {
		qp.mu.Unlock()
		return nil
	}
	qp.destroyed = true
	c := qp.conn
	qp.mu.Unlock()
	if c != nil {
		c.abort(false)
	}
	return c
}
