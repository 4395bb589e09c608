package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// qconn is one QP of a session (or of a login in progress) with
// everything it owns: its own protection domain, so no STag registered for
// it is usable from any other QP; one CQ for sends and receives; receive
// and send message buffers; the slots and their workers; the write
// grants; its registration of the volume's lock table.
type qconn struct {
	t    *Target
	log  *slog.Logger
	pd   *rnic.PD
	cq   *rnic.CQ
	qp   *rnic.QP
	sess *session

	credits int // slots granted at login (0 while logging in)
	nrx     int // receives posted
	rxBuf   []byte
	rxMR    *rnic.MR
	txBuf   []byte // one MaxMessage area per slot, then two spare (login, GOODBYE)
	txMR    *rnic.MR
	lockMR  *rnic.MR
	// inline is the largest READ answered with DATA (0: the QP has no
	// inline reads); inBuf holds one DATA area of inArea bytes per slot.
	inline int
	inArea int
	inBuf  []byte
	inMR   *rnic.MR

	slots  []slot
	grants grantTable

	ctx    context.Context // cancelled at teardown
	cancel context.CancelFunc

	dead     chan struct{} // closed when the QP is known to be going away
	deadOnce sync.Once
	byeDone  chan struct{} // closed when the GOODBYE Send completed
	byeOnce  sync.Once

	wg       sync.WaitGroup // poller and workers
	downOnce sync.Once
}

// Work request IDs of the target's send queue.
const (
	wrGoodbye = 1 << 62
)

// newQConn allocates a QP sized for cfg.MaxCredits, with two receives
// posted for LOGIN and PROOF.
func (t *Target) newQConn() (*qconn, error) {
	c := t.cfg
	q := &qconn{t: t, log: t.log, dead: make(chan struct{}), byeDone: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	var err error
	if q.pd, err = t.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("target: allocate PD: %w", err)
	}
	rq := 2 * c.MaxCredits
	sq := 4*c.MaxCredits + 8
	if q.cq, err = t.dev.CreateCQ(rq+sq+8, 0); err != nil {
		q.release()
		return nil, fmt.Errorf("target: create CQ: %w", err)
	}
	q.qp, err = q.pd.CreateQP(rnic.QPConfig{SendCQ: q.cq, RecvCQ: q.cq, SQDepth: sq, RQDepth: rq, MaxSendSGE: 1,
		MaxRecvSGE: 1, IRD: c.IRD, ORD: 1, InboundRead: true, InboundWrite: true, InboundAtomic: true, Privileged: true})
	if err != nil {
		q.release()
		return nil, fmt.Errorf("target: create QP: %w", err)
	}
	q.rxBuf = make([]byte, rq*blockproto.MaxMessage)
	if q.rxMR, err = q.pd.RegisterBytes(q.rxBuf, rnic.LocalWrite); err != nil {
		q.release()
		return nil, fmt.Errorf("target: register receive buffers: %w", err)
	}
	q.txBuf = make([]byte, (c.MaxCredits+2)*blockproto.MaxMessage)
	if q.txMR, err = q.pd.RegisterBytes(q.txBuf, rnic.LocalRead|rnic.LocalWrite); err != nil {
		q.release()
		return nil, fmt.Errorf("target: register send buffers: %w", err)
	}
	for i := 0; i < 2; i++ {
		if err := q.postRecv(i); err != nil {
			q.release()
			return nil, err
		}
	}
	q.nrx = 2
	return q, nil
}

func (q *qconn) rx(i int) []byte {
	return q.rxBuf[i*blockproto.MaxMessage : (i+1)*blockproto.MaxMessage]
}

func (q *qconn) postRecv(i int) error {
	_, err := q.qp.PostRecv(rnic.RecvWR{ID: uint64(i), SGL: []rnic.SGE{{STag: q.rxMR.STag(),
		TO: uint64(i * blockproto.MaxMessage), Len: blockproto.MaxMessage}}})
	if err != nil {
		return fmt.Errorf("target: post receive: %w", err)
	}
	return nil
}

// txArea returns send area i (slot index, or credits/credits+1 for the
// spares) and the SGE naming its first n bytes.
func (q *qconn) txArea(i int) []byte {
	return q.txBuf[i*blockproto.MaxMessage : (i+1)*blockproto.MaxMessage]
}

func (q *qconn) txSGE(i, n int) rnic.SGE {
	return rnic.SGE{STag: q.txMR.STag(), TO: uint64(i * blockproto.MaxMessage), Len: uint32(n)}
}

// setupInline gives the QP inline reads of up to n bytes: one registered
// DATA area per slot.
func (q *qconn) setupInline(n int) error {
	q.inArea = blockproto.DataLen(n)
	q.inBuf = make([]byte, q.credits*q.inArea)
	mr, err := q.pd.RegisterBytes(q.inBuf, rnic.LocalRead|rnic.LocalWrite)
	if err != nil {
		return fmt.Errorf("target: register inline send buffers: %w", err)
	}
	q.inMR, q.inline = mr, n
	return nil
}

// dataArea returns slot i's DATA area and the SGE naming its first n
// bytes.
func (q *qconn) dataArea(i int) []byte { return q.inBuf[i*q.inArea : (i+1)*q.inArea] }

func (q *qconn) dataSGE(i, n int) rnic.SGE {
	return rnic.SGE{STag: q.inMR.STag(), TO: uint64(i * q.inArea), Len: uint32(n)}
}

// loginArea and byeArea are the two spare send areas.
func (q *qconn) loginArea() int { return q.t.cfg.MaxCredits }
func (q *qconn) byeArea() int   { return q.t.cfg.MaxCredits + 1 }

// waitRecv waits for the next receive completion during login.
func (q *qconn) waitRecv(ctx context.Context) (rnic.WC, []byte, error) {
	var wc [1]rnic.WC
	for {
		if _, err := q.cq.Wait(ctx, wc[:]); err != nil {
			return rnic.WC{}, nil, fmt.Errorf("target: waiting for a login message: %w", err)
		}
		if wc[0].Status != rnic.StatusSuccess {
			return rnic.WC{}, nil, fmt.Errorf("target: during login: %w", wc[0].Err())
		}
		if wc[0].Op == rnic.WRRecv {
			return wc[0], q.rx(int(wc[0].ID))[:wc[0].Bytes], nil
		}
	}
}

// markDead records that the QP is going away.
func (q *qconn) markDead() { q.deadOnce.Do(func() { close(q.dead) }) }

func (q *qconn) isDead() bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// kill resets the connection (used for logins in progress at shutdown).
func (q *qconn) kill() {
	q.markDead()
	if q.qp.State() == rnic.StateRTS {
		q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
	q.cancel()
}

// poll runs the QP's completion loop until the QP dies or teardown.
func (q *qconn) poll() {
	defer q.wg.Done()
	var wcs [64]rnic.WC
	for {
		n, err := q.cq.Wait(q.ctx, wcs[:])
		if err != nil {
			return
		}
		// The answers to a batch of commands run here (runsHere) leave
		// together when the batch is done.
		q.qp.Plug()
		ok := q.handle(wcs[:n])
		q.qp.Unplug()
		if !ok {
			return
		}
	}
}

// handle processes a batch of completions; false: the poller must stop.
func (q *qconn) handle(wcs []rnic.WC) bool {
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != rnic.StatusSuccess {
			if !q.isDead() && wc.Status != rnic.StatusFlushed {
				q.log.Info("work request failed: ending session", "qp", q.qp.ID(), "err", wc.Err())
			}
			q.lost()
			return false
		}
		if wc.Op == rnic.WRRecv {
			if err := q.onRecv(wc); err != nil {
				q.protocolError(err)
				return false
			}
		} else if wc.ID == wrGoodbye {
			q.byeOnce.Do(func() { close(q.byeDone) })
		}
	}
	return true
}

// lost ends the session because this QP's connection is gone.
func (q *qconn) lost() {
	q.markDead()
	reason := "connection lost"
	if q.qp.State() == rnic.StateIdle {
		reason = "initiator closed the connection" // an orderly close (FIN both ways)
	}
	go q.sess.end(reason)
}

// protocolError ends the session for a peer's protocol violation.
func (q *qconn) protocolError(err error) {
	q.t.m.ProtocolErrors.Add(1)
	q.log.Warn("protocol violation: ending session", "qp", q.qp.ID(), "session", q.sess.id, "err", err)
	q.markDead()
	go q.sess.end("protocol violation")
}

// down tears the QP down: it resets the connection, waits until the
// engine is done with every buffer, stops the poller and workers, and
// releases everything. Safe to call more than once.
func (q *qconn) down() {
	q.downOnce.Do(func() {
		q.markDead()
		if q.qp != nil {
			if q.qp.State() == rnic.StateRTS {
				q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
			}
			waitStopped(q.qp)
		}
		q.cancel()
		q.wg.Wait()
		// onRecv counts a command (begin) before it wakes the slot's
		// worker; a worker that saw q.ctx end first left without it, and
		// without this the count never drops and Shutdown waits forever.
		for i := range q.slots {
			select {
			case <-q.slots[i].wake:
				q.t.end()
			default:
			}
		}
		q.release()
	})
}

// waitStopped waits (up to a minute) until the QP is in Error or Idle:
// then the engine no longer touches its buffers.
func waitStopped(qp *rnic.QP) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		switch qp.State() {
		case rnic.StateError, rnic.StateIdle:
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		qp.WaitState(ctx, rnic.StateError)
		cancel()
	}
}

// release frees the QP's resources (after the engine stopped using them).
func (q *qconn) release() {
	for i := range q.slots {
		q.slots[i].release()
	}
	q.grants.release(q.t)
	var errs []error
	dealloc := func(mr *rnic.MR) {
		if mr != nil {
			if err := mr.Dealloc(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	dealloc(q.rxMR)
	dealloc(q.txMR)
	dealloc(q.inMR)
	dealloc(q.lockMR)
	if q.qp != nil {
		if err := q.qp.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if q.cq != nil {
		if err := q.cq.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if q.pd != nil {
		if err := q.pd.Dealloc(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		q.log.Warn("releasing QP resources", "err", err)
	}
}

// sayGoodbye sends GOODBYE (signaled; Value 1 if every acknowledged
// write is durable) and waits for its completion, then closes the
// connection gracefully.
func (q *qconn) sayGoodbye(ctx context.Context, synced bool, detail string) {
	if q.isDead() {
		return
	}
	a := q.byeArea()
	m, err := blockproto.EncodeResponse(q.txArea(a), &blockproto.ResponseFields{Op: blockproto.OpGoodbye, Status: blockproto.StatusShutdown,
		Value: goodbyeValue(synced), Detail: detail})
	if err != nil {
		return
	}
	if _, err := q.qp.PostSend(rnic.SendWR{ID: wrGoodbye, Op: rnic.WRSend, SGL: []rnic.SGE{q.txSGE(a, len(m))}}); err != nil {
		return
	}
	select {
	case <-q.byeDone:
	case <-q.dead:
	case <-ctx.Done():
	}
	if q.qp.State() == rnic.StateRTS {
		q.qp.Modify(rnic.StateClosing, rnic.ModifyAttrs{})
	}
}

func goodbyeValue(synced bool) uint64 {
	if synced {
		return blockproto.GoodbyeSynced
	}
	return 0
}
