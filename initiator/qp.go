package initiator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// Per-slot send areas: the command, and the RELEASE (which may still wait
// in the send queue when the slot's next command is written).
const (
	cmdArea  = 64
	slotArea = 2 * cmdArea
	numAtoms = 16 // atomic operations in flight per QP
)

// Work request IDs of the initiator's send queue.
const (
	idRead = 1 << 62 // | slot: the RDMA Read of a READ exchange
	idAtom = 1 << 61 // | atomic slot
	idMask = 1<<32 - 1
)

// iqp is one QP of a session.
type iqp struct {
	s       *session
	qp      *rnic.QP
	cq      *rnic.CQ
	credits int

	// inline is the largest read answered inline on this QP (0: none):
	// what the WELCOME granted of the askInline the LOGIN asked for, which
	// sized the receive buffers (rxSize bytes each).
	askInline int
	inline    uint32
	rxSize    int
	rxBuf     []byte
	rxMR      *rnic.MR
	rxWR      []rnic.RecvWR // prebuilt, one per receive buffer
	rxSGE     []rnic.SGE

	txBuf   []byte // slot areas, then one MaxMessage login area
	txMR    *rnic.MR
	atomBuf []byte
	atomMR  *rnic.MR
	// lockSTag is the lock table's STag as registered for this QP.
	lockSTag rnic.STag

	slots []islot
	free  chan int // free slot indexes
	atoms [numAtoms]atomSlot
	afree chan int

	gmu    sync.Mutex
	grants []blockproto.GrantFields

	goodbye bool // GOODBYE received (poller only)

	dead     chan struct{}
	deadOnce sync.Once
	done     chan struct{} // poller exited
}

// atomSlot is one atomic operation's result word and completion.
type atomSlot struct {
	done   chan rnic.Status
	remote rnic.RemoteAddr
}

// newIQP creates a QP asking for credits and inline reads of up to inline
// bytes (0: none), with its buffers registered and every receive posted.
func (s *session) newIQP(credits, inline int) (*iqp, error) {
	c := s.c
	q := &iqp{s: s, credits: credits, askInline: inline, dead: make(chan struct{}), done: make(chan struct{})}
	// Every receive may get a DATA: the credit rules leave no way to
	// steer it to a particular one.
	q.rxSize = blockproto.MaxMessage
	if inline > 0 {
		q.rxSize = max(q.rxSize, blockproto.DataLen(inline))
	}
	nrx := credits + 2
	sq := 4*credits + 2*numAtoms + 8
	var err error
	if q.cq, err = c.dev.CreateCQ(nrx+sq+8, 0); err != nil {
		return nil, fmt.Errorf("initiator: create CQ: %w", err)
	}
	q.qp, err = s.pd.CreateQP(rnic.QPConfig{SendCQ: q.cq, RecvCQ: q.cq, SQDepth: sq, RQDepth: nrx, MaxSendSGE: 1,
		MaxRecvSGE: 1, IRD: 1, ORD: c.cfg.ORD, InboundWrite: true})
	if err != nil {
		q.release()
		return nil, fmt.Errorf("initiator: create QP: %w", err)
	}
	q.rxBuf = make([]byte, nrx*q.rxSize)
	if q.rxMR, err = s.pd.RegisterBytes(q.rxBuf, rnic.LocalWrite); err != nil {
		q.release()
		return nil, fmt.Errorf("initiator: register receive buffers: %w", err)
	}
	q.txBuf = make([]byte, credits*slotArea+blockproto.MaxMessage)
	if q.txMR, err = s.pd.RegisterBytes(q.txBuf, rnic.LocalRead|rnic.LocalWrite); err != nil {
		q.release()
		return nil, fmt.Errorf("initiator: register send buffers: %w", err)
	}
	q.atomBuf = make([]byte, numAtoms*8)
	if q.atomMR, err = s.pd.RegisterBytes(q.atomBuf, rnic.LocalRead|rnic.LocalWrite); err != nil {
		q.release()
		return nil, fmt.Errorf("initiator: register atomic buffers: %w", err)
	}
	q.rxWR = make([]rnic.RecvWR, nrx)
	q.rxSGE = make([]rnic.SGE, nrx)
	for i := range q.rxWR {
		q.rxSGE[i] = rnic.SGE{STag: q.rxMR.STag(), TO: uint64(i * q.rxSize), Len: uint32(q.rxSize)}
		q.rxWR[i] = rnic.RecvWR{ID: uint64(i), SGL: q.rxSGE[i : i+1]}
	}
	if _, err := q.qp.PostRecv(q.rxWR...); err != nil {
		q.release()
		return nil, fmt.Errorf("initiator: post receives: %w", err)
	}
	q.afree = make(chan int, numAtoms)
	for i := range q.atoms {
		q.atoms[i].done = make(chan rnic.Status, 1)
		q.afree <- i
	}
	return q, nil
}

// setCredits sizes the slots to what the WELCOME granted.
func (q *iqp) setCredits(n int) {
	q.credits = n
	q.slots = make([]islot, n)
	q.free = make(chan int, n)
	for i := range q.slots {
		sl := &q.slots[i]
		sl.q, sl.idx = q, i
		sl.done = make(chan struct{}, 1)
		q.free <- i
	}
}

func (q *iqp) rx(i int) []byte {
	return q.rxBuf[i*q.rxSize : (i+1)*q.rxSize]
}

func (q *iqp) repost(i int) error {
	if _, err := q.qp.PostRecv(q.rxWR[i]); err != nil {
		return fmt.Errorf("initiator: repost receive: %w", err)
	}
	return nil
}

// loginArea is the send area of the login messages.
func (q *iqp) loginArea() ([]byte, uint64) {
	o := len(q.txBuf) - blockproto.MaxMessage
	return q.txBuf[o:], uint64(o)
}

// cmdBuf / relBuf are slot i's command and RELEASE areas.
func (q *iqp) cmdBuf(i int) ([]byte, uint64) {
	o := i * slotArea
	return q.txBuf[o : o+cmdArea], uint64(o)
}

func (q *iqp) relBuf(i int) ([]byte, uint64) {
	o := i*slotArea + cmdArea
	return q.txBuf[o : o+cmdArea], uint64(o)
}

// idle reports whether no exchange and no atomic is in flight on the QP.
func (q *iqp) idle() bool { return len(q.free) == len(q.slots) && len(q.afree) == numAtoms }

func (q *iqp) isDead() bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// takeGrant returns a write grant, if the QP has one.
func (q *iqp) takeGrant() (blockproto.GrantFields, bool) {
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

func (q *iqp) putGrant(g blockproto.GrantFields) {
	if g.STag == 0 {
		return
	}
	q.gmu.Lock()
	q.grants = append(q.grants, g)
	q.gmu.Unlock()
}

// acquire waits for a free slot.
func (q *iqp) acquire(ctx context.Context) (*islot, error) {
	select {
	case i := <-q.free:
		return &q.slots[i], nil
	default:
	}
	select {
	case i := <-q.free:
		return &q.slots[i], nil
	case <-q.dead:
		return nil, errConnLost
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// die ends the QP: the connection is reset, every exchange in flight
// fails with errConnLost, and the session is told. Poller goroutine only.
func (q *iqp) die(cause error, flushed bool) {
	q.deadOnce.Do(func() {
		close(q.dead)
		if !flushed {
			q.stop()
		}
		for i := range q.slots {
			q.slots[i].fail()
		}
		go q.s.fail(cause)
	})
}

// stop resets the QP if it is still running and waits until the engine
// is done with it, which the QP shows by reaching Error or Idle (it gets
// there only after its receiver and transmitter stopped). Completions met
// on the way are dropped: the exchanges they belong to are failed.
func (q *iqp) stop() {
	if q.qp.State() == rnic.StateRTS {
		q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
	deadline := time.Now().Add(time.Minute)
	var wcs [64]rnic.WC
	for time.Now().Before(deadline) {
		if st := q.qp.State(); st == rnic.StateError || st == rnic.StateIdle {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		q.cq.Wait(ctx, wcs[:])
		cancel()
	}
}

// release frees the QP's resources (the engine is done with them).
func (q *iqp) release() {
	for _, mr := range []*rnic.MR{q.rxMR, q.txMR, q.atomMR} {
		if mr != nil {
			mr.Dealloc()
		}
	}
	if q.qp != nil {
		q.qp.Destroy()
	}
	if q.cq != nil {
		q.cq.Destroy()
	}
}
