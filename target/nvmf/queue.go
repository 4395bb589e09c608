package nvmf

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/target"
)

// queue is one NVMe/RDMA queue, admin (qid 0) or I/O: an RNIC QP in its
// own protection domain with one CQ, a receive buffer per submission queue
// entry (a command capsule: the command, plus in-capsule data on I/O
// queues), and twice as many command slots. A slot holds one command from
// its arrival until the Send of its completion has left: its copy of the
// command, its data buffer and the STag that buffer is registered under
// while data moves, and the 16-byte completion.
//
// One poller goroutine takes the queue's completions: it reads commands,
// runs those that cannot block (and every command on a volume in memory)
// itself, and starts a goroutine for the others; a Send completion frees
// its slot. Data moves with RDMA Write (controller to host) and RDMA Read
// (host to controller) against the host's key (transfer.go).
type queue struct {
	s      *Server
	log    *slog.Logger
	qid    uint16
	size   int // submission queue entries: the receives posted
	rxLen  int // bytes of one receive buffer
	remote net.Addr
	local  string // the address the host reached, "host:port"
	info   *rnic.ConnInfo

	ep *endpoint.Endpoint // QP, CQ, receive buffers, a completion area per slot, the loop

	slots []slot
	free  []int32 // free slot indexes (poller only)
	// sqhd is the SQ head pointer completions report: the commands taken,
	// modulo sqEntries, the submission queue's size (the CM request's
	// until a Connect command gives its own; poller only).
	sqhd      atomic.Uint32
	sqEntries uint32

	ctrl atomic.Pointer[controller]
	// connecting is set while a Connect command is being processed and
	// stays set once it succeeded.
	connecting atomic.Bool

	ctx      context.Context // the endpoint's: ends at teardown
	wg       sync.WaitGroup  // command goroutines
	dead     chan struct{}
	deadOnce sync.Once
	endOnce  sync.Once
	ended    chan struct{}
}

// Work request IDs: the kind in bits 32 and up, the slot index below.
const (
	wrCompletion = 1 << 32 // the completion's Send
	wrRead       = 2 << 32 // an RDMA Read of the command's data
	wrSlotMask   = 1<<32 - 1
)

// connectTimeout bounds the wait for a new queue's Connect command.
const connectTimeout = 30 * time.Second

// newQueue allocates a queue for a checked connection request, with its
// receives posted (before the MPA Reply, so the Connect command that
// follows it at once finds one: iWARP has no receiver-not-ready retry).
func (s *Server) newQueue(r CMRequest, remote net.Addr) (*queue, error) {
	q := &queue{s: s, qid: r.QID(), size: int(r.HSQSize()) + 1, remote: remote, rxLen: CommandLen,
		dead: make(chan struct{}), ended: make(chan struct{})}
	q.sqEntries = uint32(q.size)
	if q.qid != 0 {
		q.rxLen += s.cfg.InCapsule
	}
	q.log = s.log.With("peer", remote.String(), "qid", q.qid)
	nslots := 2 * q.size
	// Per slot at most a Fast-Register, a Write or Read, an Invalidate and
	// the completion's Send. IRD 0: the host never reads controller
	// memory (its RDMA Read Request would be refused with a Terminate).
	// InboundWrite: RDMA Read Responses land through it.
	var err error
	q.ep, err = endpoint.New(endpoint.Config{Device: s.cfg.Device, Receives: q.size, RecvSize: q.rxLen,
		SendAreas: nslots, SendSize: CompletionLen,
		QP: rnic.QPConfig{SQDepth: 4*nslots + 8, MaxSendSGE: 1, MaxWriteSGE: 1, IRD: 0, ORD: s.cfg.ORD,
			InboundWrite: true, Privileged: true}})
	if err != nil {
		return nil, fmt.Errorf("nvmf: queue: %w", err)
	}
	q.ctx = q.ep.Context()
	q.slots = make([]slot, nslots)
	q.free = make([]int32, 0, nslots)
	for i := nslots - 1; i >= 0; i-- {
		sl := &q.slots[i]
		sl.q, sl.idx, sl.rx = q, i, -1
		if sl.mr, err = q.ep.AllocSTag(true); err != nil {
			q.ep.Close(nil)
			return nil, fmt.Errorf("nvmf: allocate slot STag: %w", err)
		}
		sl.stag = sl.mr.STag()
		q.free = append(q.free, int32(i))
	}
	return q, nil
}

// rx returns receive buffer i.
func (q *queue) rx(i int) []byte { return q.ep.Recv(i) }

// start runs the poller and drops the queue if no Connect arrives in time.
func (q *queue) start() {
	q.ep.Start(q.handle)
	go func() {
		t := time.NewTimer(connectTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			if q.ctrl.Load() == nil {
				q.log.Info("no Connect command: dropping the queue", "waited", connectTimeout)
				q.end("no Connect")
			}
		case <-q.dead:
		}
	}()
}

func (q *queue) markDead() { q.deadOnce.Do(func() { close(q.dead) }) }

func (q *queue) isDead() bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// handle processes a batch of work completions (the endpoint's loop, the
// poller); false: the queue is over.
func (q *queue) handle(wcs []rnic.WC) bool {
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != rnic.StatusSuccess {
			reason := "connection lost"
			if !q.isDead() && wc.Status != rnic.StatusFlushed {
				reason = "work request failed: " + wc.Err().Error()
				q.s.m.ProtocolErrors.Add(1)
				q.log.Info("queue failed", "err", wc.Err())
			}
			go q.end(reason)
			return false
		}
		switch {
		case wc.Op == rnic.WRRecv:
			if err := q.onCommand(int(wc.ID), int(wc.Bytes), wc); err != nil {
				q.s.m.ProtocolErrors.Add(1)
				q.log.Warn("protocol violation: ending the queue", "err", err)
				go q.end("protocol violation")
				return false
			}
		case wc.ID&^wrSlotMask == wrCompletion:
			q.freeSlot(&q.slots[wc.ID&wrSlotMask])
		case wc.ID&^wrSlotMask == wrRead:
			q.readDone(&q.slots[wc.ID&wrSlotMask])
		}
	}
	return true
}

// onCommand takes a command capsule from receive buffer i.
func (q *queue) onCommand(i, n int, wc *rnic.WC) error {
	if wc.HasInvalidated {
		return fmt.Errorf("command capsule sent with Invalidate of STag %s", wc.Invalidated)
	}
	if n < CommandLen {
		return fmt.Errorf("command capsule of %d bytes", n)
	}
	if len(q.free) == 0 {
		return fmt.Errorf("more commands than submission queue entries (%d)", q.size)
	}
	sl := &q.slots[q.free[len(q.free)-1]]
	q.free = q.free[:len(q.free)-1]
	copy(sl.cmd[:], q.rx(i)[:CommandLen])
	sl.rx, sl.inCapsule = i, n-CommandLen
	sl.began = time.Now()
	sl.data, sl.invalidate, sl.kind = Data{}, false, -1
	q.sqhd.Store((q.sqhd.Load() + 1) % q.sqEntries)
	if c := q.ctrl.Load(); c != nil {
		c.touch()
	}
	q.dispatch(sl)
	return nil
}

// dispatch routes a command: fabrics commands, then nothing else before
// Connect, then the admin or the I/O command set.
func (q *queue) dispatch(sl *slot) {
	c := sl.command()
	if c.Fuse() != 0 {
		// No fused operation is offered (Identify Controller FUSES is 0):
		// FUSE 01b or 10b is an unsupported value of the field. Run as a
		// plain command, the Write of a Compare and Write pair would
		// change the blocks whatever the Compare found.
		q.complete(sl, 0, fail(StatusInvalidField, "opcode 0x%02x with FUSE %d: fused operations are not supported",
			c.Opcode(), c.Fuse()))
		return
	}
	if c.Opcode() == OpcodeFabrics {
		q.fabrics(sl, c)
		return
	}
	ctrl := q.ctrl.Load()
	if ctrl == nil {
		q.complete(sl, 0, fail(StatusCmdSeqError, "opcode 0x%02x before Connect", c.Opcode()))
		return
	}
	if q.qid == 0 {
		ctrl.admin(q, sl, c)
	} else {
		ctrl.io(q, sl, c)
	}
}

// freeSlot ends a slot's command once its completion has left.
func (q *queue) freeSlot(sl *slot) {
	q.s.putBuf(sl.buf)
	sl.buf, sl.then = nil, nil
	q.free = append(q.free, int32(sl.idx))
}

// run executes fn for a command: in the poller if it cannot block (inline
// is true, e.g. the volume is in memory), else in a goroutine of its own.
func (q *queue) run(sl *slot, inline bool, fn func(*slot)) {
	if inline {
		fn(sl)
		return
	}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		fn(sl)
	}()
}

// end tears the queue down: the connection is reset (if it still runs),
// the engine is done with every buffer, the poller and the command
// goroutines have returned; then everything is released and the
// controller told. Safe to call more than once, from any goroutine but the
// poller.
func (q *queue) end(reason string) {
	q.endOnce.Do(func() {
		q.markDead()
		err := q.ep.Close(func() {
			q.wg.Wait()
			for i := range q.slots {
				q.s.putBuf(q.slots[i].buf)
				q.slots[i].buf = nil
			}
		})
		if err != nil {
			q.log.Warn("releasing queue resources", "err", err)
		}
		q.s.mu.Lock()
		_, counted := q.s.queues[q]
		delete(q.s.queues, q)
		q.s.mu.Unlock()
		if counted {
			q.s.m.Queues.Add(-1)
		}
		if c := q.ctrl.Load(); c != nil {
			c.queueGone(q, reason)
		} else {
			q.log.Debug("queue ended", "reason", reason)
		}
		close(q.ended)
	})
	<-q.ended
}

// slot is one command in progress (see queue).
type slot struct {
	q   *queue
	idx int
	cmd [CommandLen]byte
	// rx is the receive buffer the command came in, held while its
	// in-capsule data is in use (-1: re-posted).
	rx        int
	inCapsule int // capsule bytes after the command
	data      Data
	// invalidate: the completion is a Send with Invalidate of data.Key
	// (the host's keyed SGL had subtype 0xF).
	invalidate bool
	began      time.Time
	kind       target.OpKind // I/O command kind for the metrics; -1 for others

	buf  []byte    // pooled data buffer
	mr   *rnic.MR  // the slot's STag, registered over buf while data moves
	stag rnic.STag // as last registered
	then func(*slot)

	pages [1][]byte
	fr    rnic.FastReg
	wrs   [4]rnic.SendWR
	sges  [2]rnic.SGE
}

func (sl *slot) command() Command { return Command(sl.cmd[:]) }
