package rnic

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestCQOverflowTwice: each overflow of a CQ raises CQ Overflow Detected
// once; after the consumer made room (polled), a new overflow raises it
// again (not only after a Resize).
func TestCQOverflowTwice(t *testing.T) {
	d, _, cq, qp, mr, evs := idleQP(t, 4, 16)
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
		barrier := make(chan struct{}) // after the events raised so far
		d.disp.post(func() { close(barrier) })
		<-barrier
		select {
		case ev := <-evs:
			t.Fatalf("round %d: second event %+v in one overflow", round, ev)
		default:
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

// TestCQNotify: one-shot arming (checkArming), and a completion handler
// instead of the channel.
func TestCQNotify(t *testing.T) {
	a, b, bRecv := notifyPair(t)
	checkArming(t, a, b)
	// A handler instead of the channel.
	called := make(chan *CQ, 1)
	id, err := b.dev.SetCompletionHandler(0, func(cq *CQ) { called <- cq })
	if err != nil {
		t.Fatal(err)
	}
	_ = id
	cq2, err := b.dev.CreateCQ(4, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := cq2.RequestNotify(false); err != nil {
		t.Fatal(err)
	}
	qp, err := b.pd.CreateQP(QPConfig{SendCQ: cq2, RecvCQ: cq2, SQDepth: 4, RQDepth: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qp.PostRecv(RecvWR{ID: 1, SGL: []SGE{{STag: bRecv.STag(), Len: 8}}}); err != nil {
		t.Fatal(err)
	}
	qp.Modify(StateError, ModifyAttrs{}) // flushes the receive: a completion
	select {
	case cq := <-called:
		if cq != cq2 {
			t.Fatal("handler called for another CQ")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("completion handler not called")
	}
}

// TestCQNotifySolicitedDirectDeclines: a CQ whose direct handler declines
// the completions of each receive batch (as when another goroutine is
// polling) notifies as a CQ without one (checkArming): armed for
// solicited completions only, an unsolicited receive does not fire it.
func TestCQNotifySolicitedDirectDeclines(t *testing.T) {
	a, b, _ := notifyPair(t)
	var declined atomic.Int32
	b.rcq.SetDirectHandler(func() bool {
		declined.Add(1)
		return false
	})
	checkArming(t, a, b)
	if declined.Load() == 0 {
		t.Fatal("the direct handler never ran")
	}
}

// notifyPair connects a to b, with 8 receives of 64 bytes posted on b.
func notifyPair(t *testing.T) (a, b *side, bRecv *MR) {
	a, b = newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(1); i <= 8; i++ {
			b.postRecv(i, bRecv, 64)
		}
	})
	return a, b, bRecv
}

// checkArming checks one-shot arming on b's receive CQ as a sends: armed
// for "solicited" it fires only for a solicited receive; once fired it
// stays quiet until re-armed; armed for "next" it fires on any completion.
// The channel is the notification; nobody polls meanwhile.
func checkArming(t *testing.T, a, b *side) {
	t.Helper()
	// settle waits until b's receiver is done with everything a sent so
	// far, the end of its batch (direct handler, notification) included
	// (it sends the Read Response after that), and checks that n
	// completions are queued (not polled).
	settle := func(n int) {
		t.Helper()
		a.roundTrip()
		if b.rcq.Len() != n {
			t.Fatalf("%d completions queued, want %d", b.rcq.Len(), n)
		}
	}
	if err := b.rcq.RequestNotify(true); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 1, Op: WRSend})
	settle(1)
	if notified(b.rcq, 0) {
		t.Fatal("solicited-only notification fired for an unsolicited Send")
	}
	a.post(SendWR{ID: 2, Op: WRSendSE})
	settle(2)
	if !notified(b.rcq, 0) {
		t.Fatal("no notification for a solicited Send")
	}
	a.post(SendWR{ID: 3, Op: WRSendSE})
	settle(3)
	if notified(b.rcq, 0) {
		t.Fatal("notification fired again without re-arming")
	}
	if err := b.rcq.RequestNotify(false); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 4, Op: WRSend})
	settle(4)
	if !notified(b.rcq, 0) {
		t.Fatal("no notification for the next completion")
	}
	if got := drainCQ(b.rcq); len(got) != 4 || got[1].Solicited != true || got[0].Solicited {
		t.Fatalf("completions %+v", got)
	}
}

// TestCQResizeAndOverflow: a CQ shrinks only while its entries fit, grows
// keeping them in order, and on overflow keeps what it has (nothing is
// overwritten) and raises CQ Overflow once.
func TestCQResizeAndOverflow(t *testing.T) {
	_, _, cq, qp, mr, evs := idleQP(t, 4, 16)
	for i := uint64(0); i < 3; i++ {
		qp.PostRecv(RecvWR{ID: i, SGL: []SGE{{STag: mr.STag(), Len: 8}}})
	}
	qp.Modify(StateError, ModifyAttrs{})
	if cq.Len() != 3 {
		t.Fatalf("%d entries", cq.Len())
	}
	if _, err := cq.Resize(2); !errors.Is(err, ErrCQShrink) {
		t.Fatalf("shrink below the entries present: %v", err)
	}
	if n, err := cq.Resize(8); err != nil || n < 8 {
		t.Fatalf("grow: %d %v", n, err)
	}
	if n, _ := cq.Query(); n < 8 {
		t.Fatalf("query after resize: %d", n)
	}
	wcs := drainCQ(cq)
	if len(wcs) != 3 || wcs[0].ID != 0 || wcs[2].ID != 2 {
		t.Fatalf("entries after resize %+v", wcs)
	}

	// Overflow: 12 flushed receives into an 8-entry CQ.
	qp.Modify(StateIdle, ModifyAttrs{})
	for i := uint64(0); i < 12; i++ {
		if _, err := qp.PostRecv(RecvWR{ID: 10 + i, SGL: []SGE{{STag: mr.STag(), Len: 8}}}); err != nil {
			t.Fatal(err)
		}
	}
	qp.Modify(StateError, ModifyAttrs{})
	select {
	case ev := <-evs:
		if ev.Type != EventCQOverflow || ev.CQ != cq {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no CQ Overflow event")
	}
	wcs = drainCQ(cq)
	if len(wcs) != 8 || wcs[0].ID != 10 || wcs[7].ID != 17 {
		t.Fatalf("kept %d entries %+v", len(wcs), wcs)
	}
	select {
	case ev := <-evs:
		t.Fatalf("second event %+v", ev)
	default:
	}
}

// TestWaitEmptySlice: Wait into an empty slice fails at once with
// ErrInvalidLength, a completion pending or not: no completion could end
// it, and it used to spin between the notification and an empty poll.
func TestWaitEmptySlice(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		b.postRecv(1, bRecv, 64)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := b.rcq.Wait(ctx, nil); n != 0 || !errors.Is(err, ErrInvalidLength) {
		t.Fatalf("Wait into nil: %d, %v; want ErrInvalidLength", n, err)
	}
	a.post(SendWR{ID: 1, Op: WRSend})
	a.roundTrip()
	if n, err := b.rcq.Wait(ctx, []WC{}); n != 0 || !errors.Is(err, ErrInvalidLength) {
		t.Fatalf("Wait into an empty slice with a completion pending: %d, %v; want ErrInvalidLength", n, err)
	}
	if wc := b.wait(b.rcq); wc.ID != 1 || wc.Status != StatusSuccess {
		t.Fatalf("the pending completion: %+v", wc)
	}
}
