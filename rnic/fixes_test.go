package rnic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Regression tests for engine bugs: each failed before its fix.

// postUntilRefused posts WRs on qp until posting is refused with
// ErrInvalidQPState and returns how many were accepted. After limit WRs it
// stops posting and waits for the QP to leave RTS, then posts once more: a
// test whose completions must all fit its CQ posts no more than the CQ
// holds.
func postUntilRefused(qp *QP, recv bool, mr *MR, limit int) (int, error) {
	n := 0
	for {
		if n == limit {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := qp.WaitState(ctx, StateError, StateTerminate, StateClosing, StateIdle)
			cancel()
			if err != nil {
				return n, err
			}
		}
		var err error
		var k int
		if recv {
			k, err = qp.PostRecv(RecvWR{ID: uint64(n), SGL: []SGE{{STag: mr.STag(), Len: 8}}})
		} else {
			k, err = qp.PostSend(SendWR{ID: uint64(n), Op: WRWrite, Remote: RemoteAddr{STag: 0}})
		}
		n += k
		switch {
		case err == nil:
		case errors.Is(err, ErrTooManyWRs):
			runtime.Gosched()
		case errors.Is(err, ErrInvalidQPState):
			return n, nil
		default:
			return n, fmt.Errorf("post: %w", err)
		}
		if n > limit {
			return n, fmt.Errorf("%d WRs posted, the limit was %d", n, limit)
		}
	}
}

// TestPostFlushRace: posting and flushing are atomic with respect to each
// other. A poster races Modify QP ->Error; every WR it managed to post must
// complete exactly once (successfully or Flushed), none may be left behind
// in a queue nobody will flush again (bug: the state was checked under
// qp.mu and the WR queued under sq.mu, and the flush ran in between).
func TestPostFlushRace(t *testing.T) {
	// race posts until refused on both queues of qp while modify moves it
	// to Error, and returns how many sends and receives were posted.
	race := func(t *testing.T, qp *QP, mr *MR, limit int, modify func() error) (sends, recvs int) {
		var wg sync.WaitGroup
		var serr, rerr error
		wg.Add(2)
		go func() { defer wg.Done(); sends, serr = postUntilRefused(qp, false, mr, limit) }()
		go func() { defer wg.Done(); recvs, rerr = postUntilRefused(qp, true, mr, limit) }()
		merr := modify()
		wg.Wait()
		if err := errors.Join(merr, serr, rerr); err != nil {
			t.Fatal(err)
		}
		return sends, recvs
	}
	t.Run("idle", func(t *testing.T) {
		d, pd, _, _, mr, _ := idleQP(t, 64, 16)
		cq, err := d.CreateCQ(1<<16, 0)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SQDepth: 16, RQDepth: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2000; i++ {
			// In Idle nothing completes: the queues' depths bound what is posted.
			sends, recvs := race(t, qp, mr, 1<<16, func() error {
				for k := 0; k < i%7; k++ {
					runtime.Gosched()
				}
				return qp.Modify(StateError, ModifyAttrs{})
			})
			var gotS, gotR int
			for _, wc := range drainCQ(cq) {
				if wc.Op == WRRecv {
					gotR++
				} else {
					gotS++
				}
			}
			if gotS != sends || gotR != recvs {
				t.Fatalf("iteration %d: %d sends and %d receives posted, %d and %d completed", i, sends, recvs, gotS, gotR)
			}
			if err := qp.Modify(StateIdle, ModifyAttrs{}); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("rts", func(t *testing.T) {
		for i := 0; i < 30; i++ {
			a, _ := newPair(t, pairOpts{qp: QPConfig{SQDepth: 64, InboundWrite: true, InboundRead: true}}, nil)
			mr, _ := a.reg(64, LocalWrite)
			// The Writes complete as fast as they are posted: more than the
			// send CQ holds would overflow it and end the stream in Error
			// before the Modify.
			entries, _ := a.scq.Query()
			sends, recvs := race(t, a.qp, mr, entries, func() error {
				time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
				return a.qp.Modify(StateError, ModifyAttrs{})
			})
			a.waitState(StateError)
			var gotS, gotR int
			for _, wc := range drainCQ(a.scq) {
				if wc.Status != StatusSuccess && wc.Status != StatusFlushed {
					t.Fatalf("send completion %+v", wc)
				}
				gotS++
			}
			for _, wc := range drainCQ(a.rcq) {
				if wc.Status != StatusFlushed {
					t.Fatalf("receive completion %+v", wc)
				}
				gotR++
			}
			if gotS != sends || gotR != recvs {
				t.Fatalf("iteration %d: %d sends and %d receives posted, %d and %d completed", i, sends, recvs, gotS, gotR)
			}
		}
	})
}

// TestQPRQLimit: the QP RQ Limit of a QP on an S-RQ (draft §6.3.8) fires
// once when the QP holds more than the limit S-RQ WQEs that are in
// progress (taken from the S-RQ, Work Completion not yet retrieved: §6.3.7
// keeps a WQE in the RI's scope until then), stays quiet until re-armed by
// Modify QP, and fires again after re-arming (bug: it could never fire).
func TestQPRQLimit(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{srq: true, qp: QPConfig{RQLimit: 2}}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 16; i++ {
			if _, err := b.qp.cfg.SRQ.Post(RecvWR{ID: i, SGL: []SGE{{STag: bRecv.STag(), Len: 64}}}); err != nil {
				t.Fatal(err)
			}
		}
	})
	if q := b.qp.Query(); q.RQLimit != 2 || !q.RQLimitArmed {
		t.Fatalf("query: limit %d armed %v", q.RQLimit, q.RQLimitArmed)
	}
	queued := func(n int) { // wait until n receive completions are queued, without polling
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for b.rcq.Len() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d completions queued, want %d", b.rcq.Len(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	count := func() int {
		n := 0
		for _, typ := range b.eventTypes() {
			if typ == EventQPRQLimitReached {
				n++
			}
		}
		return n
	}
	a.post(SendWR{ID: 1, Op: WRSend})
	a.post(SendWR{ID: 2, Op: WRSend})
	queued(2)
	time.Sleep(20 * time.Millisecond)
	if n := count(); n != 0 {
		t.Fatalf("%d events with 2 WQEs in progress and a limit of 2", n)
	}
	a.post(SendWR{ID: 3, Op: WRSend})
	ev := b.waitEvent(EventQPRQLimitReached)
	if ev.Resource != ResourceQP || ev.QP != b.qp || ev.QPID != b.qp.ID() {
		t.Fatalf("event %+v", ev)
	}
	if q := b.qp.Query(); q.RQLimitArmed {
		t.Fatal("still armed after the event")
	}
	// Retrieving the completions ends those WQEs' progress; the event is
	// one-shot, so more Sends raise nothing until it is re-armed.
	queued(3)
	if n := len(drainCQ(b.rcq)); n != 3 {
		t.Fatalf("%d completions", n)
	}
	for id := uint64(4); id < 8; id++ {
		a.post(SendWR{ID: id, Op: WRSend})
	}
	queued(4)
	if n := count(); n != 1 {
		t.Fatalf("%d events while disarmed", n)
	}
	if err := b.qp.Modify(StateRTS, ModifyAttrs{RQLimit: 5, ArmRQLimit: true}); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 8, Op: WRSend}) // 5 in progress: not above the limit
	queued(5)
	time.Sleep(20 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("%d events at the limit", n)
	}
	a.post(SendWR{ID: 9, Op: WRSend}) // 6 > 5
	deadline := time.Now().Add(10 * time.Second)
	for count() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second event after re-arming (%v)", b.eventTypes())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCQOverflowTwice: each overflow of a CQ raises CQ Overflow Detected
// once; after the consumer made room (polled), a new overflow raises it
// again (bug: only Resize cleared the flag, so a second overflow was
// silent).
func TestCQOverflowTwice(t *testing.T) {
	_, _, cq, qp, mr, evs := idleQP(t, 4, 16)
	overflow := func(round int) {
		t.Helper()
		for i := 0; i < 6; i++ {
			if _, err := qp.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{STag: mr.STag(), Len: 8}}}); err != nil {
				t.Fatal(err)
			}
		}
		qp.Modify(StateError, ModifyAttrs{}) // 6 flushed receives into 4 entries
		select {
		case ev := <-evs:
			if ev.Type != EventCQOverflow || ev.CQ != cq || ev.Resource != ResourceCQ {
				t.Fatalf("round %d: event %+v", round, ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no CQ Overflow event", round)
		}
		select {
		case ev := <-evs:
			t.Fatalf("round %d: second event %+v in one overflow", round, ev)
		case <-time.After(20 * time.Millisecond):
		}
		if n := len(drainCQ(cq)); n != 4 {
			t.Fatalf("round %d: kept %d entries", round, n)
		}
		if err := qp.Modify(StateIdle, ModifyAttrs{}); err != nil {
			t.Fatal(err)
		}
	}
	overflow(1)
	overflow(2)
}

// TestExplicitIRDApplied: an IRD given in AcceptParams or ConnParams is
// advertised in the MPA exchange and applied to the QP, so the peer,
// which clamps its ORD to it, can use it all (bug: only advertised; the
// QP kept its own IRD and terminated the peer's Reads past it).
func TestExplicitIRDApplied(t *testing.T) {
	const reads, size = 8, 1 << 20
	run := func(t *testing.T, o pairOpts, reqSide func(a, b *side) (req, src *side)) {
		o.qp = QPConfig{IRD: 1, ORD: 8, InboundRead: true, InboundWrite: true}
		a, b := newPair(t, o, nil)
		req, src := reqSide(a, b)
		if q := src.qp.Query(); q.IRD != 4 {
			t.Fatalf("data source IRD %d, want the advertised 4", q.IRD)
		}
		if q := req.qp.Query(); q.ORD != 4 {
			t.Fatalf("requester ORD %d, want the peer's IRD 4", q.ORD)
		}
		smr, sbuf := src.reg(size, LocalRead|RemoteRead)
		fill(sbuf, 5)
		dmr, dbuf := req.reg(reads*size, LocalWrite|RemoteWrite)
		for i := 0; i < reads; i++ {
			req.post(SendWR{ID: uint64(i), Op: WRRead, Local: SGE{STag: dmr.STag(), TO: uint64(i * size), Len: size},
				Remote: RemoteAddr{STag: smr.STag()}})
		}
		for i := 0; i < reads; i++ {
			req.waitOK(req.scq, WRRead)
			if !bytes.Equal(dbuf[i*size:(i+1)*size], sbuf) {
				t.Fatalf("read %d differs", i)
			}
		}
	}
	t.Run("accept", func(t *testing.T) {
		run(t, pairOpts{accept: func(p *AcceptParams) { p.IRD = 4 }}, func(a, b *side) (*side, *side) { return a, b })
	})
	t.Run("connect", func(t *testing.T) {
		run(t, pairOpts{connect: func(p *ConnParams) { p.IRD = 4 }}, func(a, b *side) (*side, *side) { return b, a })
	})
	t.Run("beyond-capability", func(t *testing.T) {
		s := newSide(t, "x", pairOpts{})
		c1, c2 := net.Pipe()
		c2.Close()
		defer c1.Close()
		_, err := s.dev.ConnectConn(t.Context(), s.qp, c1, ConnParams{IRD: s.dev.Query().MaxIRD + 1})
		if !errors.Is(err, ErrIRDExceedsCapability) {
			t.Fatalf("IRD beyond the RNIC's maximum: %v", err)
		}
		if s.qp.State() != StateIdle {
			t.Fatalf("QP in %s", s.qp.State())
		}
	})
}

// TestCloseWaitsForStreams: Device.Close returns only after the receive and
// transmit goroutines of its QPs ended (bug: it reset the connections and
// returned at once).
func TestCloseWaitsForStreams(t *testing.T) {
	for i := 0; i < 10; i++ {
		a, b := newPair(t, pairOpts{}, nil)
		a.qp.mu.Lock()
		c := a.qp.conn
		a.qp.mu.Unlock()
		if err := a.dev.Close(); err != nil {
			t.Fatal(err)
		}
		for _, ch := range []chan struct{}{c.rxDone, c.txDone} {
			select {
			case <-ch:
			default:
				t.Fatalf("iteration %d: Close returned while a stream goroutine runs", i)
			}
		}
		if st := a.qp.State(); st != StateError {
			t.Fatalf("QP in %s after Close", st)
		}
		b.waitState(StateError)
	}
}

// TestTerminateBlamesTheRightWR: a received Terminate completes the WR it
// concerns (found by the echoed DDP header: QN 1 and its MSN) with Remote
// Termination Error; every other outstanding WR is Flushed (bug: the
// oldest outstanding Read or atomic was always blamed).
//
// The big Read must still be outstanding when the Terminate arrives: a
// relay holds the Responder's bytes after 1 MiB until the Responder has
// found the fault, and the Responder stops its Read Response at the next
// segment once it has.
func TestTerminateBlamesTheRightWR(t *testing.T) {
	const big = 16 << 20
	t.Run("second-read", func(t *testing.T) {
		var px *proxy
		a, b := newPair(t, pairOpts{proxy: &px}, nil)
		src, _ := b.reg(big, LocalRead|RemoteRead)
		sink, _ := a.reg(big, LocalWrite|RemoteWrite)
		px.hold(1 << 20)
		// One list: the Terminate may come back before a later PostSend.
		if n, err := a.qp.PostSend(
			SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: big}, Remote: RemoteAddr{STag: src.STag()}},
			SendWR{ID: 2, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 16}, Remote: RemoteAddr{STag: src.STag().WithKey(src.STag().Key() ^ 1)}},
			SendWR{ID: 3, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 16}, Remote: RemoteAddr{STag: src.STag()}}); n != 3 || err != nil {
			t.Fatalf("posted %d: %v", n, err)
		}
		b.waitEvent(EventIRRQInvalidSTag)
		px.unhold()
		for _, want := range []struct {
			id uint64
			st Status
		}{{1, StatusFlushed}, {2, StatusRemoteTermination}, {3, StatusFlushed}} {
			if wc := a.wait(a.scq); wc.ID != want.id || wc.Status != want.st {
				t.Fatalf("completion %+v, want WR %d %s", wc, want.id, want.st)
			}
		}
		ev := a.waitEvent(EventTerminateReceived)
		if ev.Terminate.Cause != prot(term.ProtInvalidSTag) {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("write-with-read-outstanding", func(t *testing.T) {
		var px *proxy
		a, b := newPair(t, pairOpts{proxy: &px}, nil)
		src, _ := b.reg(big, LocalRead|RemoteRead)
		sink, _ := a.reg(big, LocalWrite|RemoteWrite)
		wsrc, _ := a.reg(64, LocalRead)
		px.hold(1 << 20)
		a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: big}, Remote: RemoteAddr{STag: src.STag()}})
		a.post(SendWR{ID: 2, Op: WRWrite, SGL: []SGE{{STag: wsrc.STag(), Len: 64}}, Remote: RemoteAddr{STag: 0x00ABCD01}})
		b.waitEvent(EventInvalidSTag)
		px.unhold()
		if wc := a.wait(a.scq); wc.ID != 1 || wc.Status != StatusFlushed {
			t.Fatalf("the Read the Terminate does not concern: %+v", wc)
		}
		if wc := a.wait(a.scq); wc.ID != 2 || wc.Status != StatusSuccess {
			t.Fatalf("the Write (handed to TCP before the Terminate): %+v", wc)
		}
		if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Cause != ddpTagged(term.TaggedInvalidSTag) {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("second-atomic", func(t *testing.T) {
		var px *proxy
		a, b := newPair(t, pairOpts{proxy: &px}, nil)
		src, _ := b.reg(big, LocalRead|RemoteRead)
		word, _ := b.reg(64, LocalWrite|RemoteAtomic)
		sink, _ := a.reg(big, LocalWrite|RemoteWrite)
		res, _ := a.reg(16, LocalWrite)
		px.hold(1 << 20)
		a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: big}, Remote: RemoteAddr{STag: src.STag()}})
		a.post(SendWR{ID: 2, Op: WRFetchAdd, Local: SGE{STag: res.STag(), Len: 8}, Remote: RemoteAddr{STag: word.STag(), TO: 4}, AddSwap: 1})
		b.waitEvent(EventMisalignedAtomic)
		px.unhold()
		if wc := a.wait(a.scq); wc.ID != 1 || wc.Status != StatusFlushed {
			t.Fatalf("read %+v", wc)
		}
		if wc := a.wait(a.scq); wc.ID != 2 || wc.Status != StatusRemoteTermination {
			t.Fatalf("misaligned atomic %+v", wc)
		}
	})
}
