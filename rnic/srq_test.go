package rnic

import (
	"errors"
	"testing"
	"time"
)

// TestQPRQLimit: the QP RQ Limit of a QP on an S-RQ (draft §6.3.8) fires
// once when the QP holds more than the limit S-RQ WQEs that are in
// progress (taken from the S-RQ, Work Completion not yet retrieved: §6.3.7
// keeps a WQE in the RI's scope until then), stays quiet until re-armed by
// Modify QP, and fires again after re-arming.
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
	b.settle(nil) // the event would be raised when a WQE is taken, before its completion
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
	b.settle(nil)
	if n := count(); n != 1 {
		t.Fatalf("%d events while disarmed", n)
	}
	if err := b.qp.Modify(StateRTS, ModifyAttrs{RQLimit: 5, ArmRQLimit: true}); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 8, Op: WRSend}) // 5 in progress: not above the limit
	queued(5)
	b.settle(nil)
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

// TestSRQLimit: an armed S-RQ limit raises SRQ Limit Reached once, when the
// available WQEs drop below it, and disarms.
func TestSRQLimit(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{srq: true}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 8; i++ {
			b.qp.cfg.SRQ.Post(RecvWR{ID: i, SGL: []SGE{{STag: bRecv.STag(), Len: 64}}})
		}
	})
	srq := b.qp.cfg.SRQ
	if err := srq.Modify(0, srq.Query().MaxWR+1, true); !errors.Is(err, ErrSRQLimit) {
		t.Fatalf("limit above the depth accepted")
	}
	if err := srq.Modify(0, 6, true); err != nil {
		t.Fatal(err)
	}
	if q := srq.Query(); q.Limit != 6 || !q.LimitArmed || q.Available != 8 {
		t.Fatalf("query %+v", q)
	}
	for i := uint64(0); i < 2; i++ {
		a.post(SendWR{ID: i, Op: WRSend})
		b.waitOK(b.rcq, WRRecv)
	}
	if ts := b.eventTypes(); len(ts) != 0 {
		t.Fatalf("events at 6 available: %v", ts)
	}
	a.post(SendWR{ID: 3, Op: WRSend})
	b.waitOK(b.rcq, WRRecv)
	ev := b.waitEvent(EventSRQLimitReached)
	if ev.SRQ != srq || ev.Resource != ResourceSRQ {
		t.Fatalf("event %+v", ev)
	}
	if q := srq.Query(); q.LimitArmed || q.Available != 5 {
		t.Fatalf("after the event %+v", q)
	}
	a.post(SendWR{ID: 4, Op: WRSend})
	b.waitOK(b.rcq, WRRecv)
	n := 0
	for _, typ := range b.eventTypes() {
		if typ == EventSRQLimitReached {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d limit events", n)
	}
}

// TestSRQModify: S-RQ resize with WRs outstanding (draft §6.3.2), refused
// below them; an armed limit above the new size is an invalid input
// modifier (§6.3.8); Destroy with WRs posted (they vanish).
func TestSRQModify(t *testing.T) {
	d, pd, _, _, mr, _ := idleQP(t, 4, 4)
	srq, err := d.CreateSRQ(pd, 8, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateSRQ(pd, 8, 1, 9); !errors.Is(err, ErrSRQLimit) {
		t.Fatalf("limit above the size at create: %v", err)
	}
	for i := 0; i < 6; i++ {
		if _, err := srq.Post(RecvWR{ID: uint64(i), SGL: []SGE{{STag: mr.STag(), Len: 8}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Modify(5, 0, false); !errors.Is(err, ErrShrink) {
		t.Fatalf("shrink below the 6 posted: %v", err)
	}
	if err := srq.Modify(6, 7, false); !errors.Is(err, ErrInvalidModifier) {
		t.Fatalf("armed limit 4 kept, new limit 7 above the new size 6: %v", err)
	}
	if err := srq.Modify(16, 4, false); err != nil {
		t.Fatal(err)
	}
	if q := srq.Query(); q.MaxWR != 16 || q.Available != 6 || !q.LimitArmed || q.Limit != 4 {
		t.Fatalf("after resize %+v", q)
	}
	for i := 6; i < 16; i++ {
		if _, err := srq.Post(RecvWR{ID: uint64(i)}); err != nil {
			t.Fatalf("post %d after growing: %v", i, err)
		}
	}
	if _, err := srq.Post(RecvWR{ID: 16}); !errors.Is(err, ErrTooManyWRs) {
		t.Fatalf("S-RQ overflow: %v", err)
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := srq.Post(RecvWR{ID: 17}); !errors.Is(err, ErrInvalidSRQ) {
		t.Fatalf("post to a destroyed S-RQ: %v", err)
	}
}
