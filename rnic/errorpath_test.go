package rnic

import (
	"testing"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Error paths between two engines: the completion status and asynchronous
// event on both sides, and the Terminate each side records.

// TestRemoteErrorReadBadSTag: a Read of an unknown source STag. The data
// source terminates with RDMAP Remote Protection / Invalid STag; the
// requester's Read completes with Remote Termination Error, every later WR
// is flushed, and both QPs end in Error.
func TestRemoteErrorReadBadSTag(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	sink, _ := a.reg(4096, LocalWrite|RemoteWrite)
	msg, _ := a.reg(64, LocalRead)
	a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 4096}, Remote: RemoteAddr{STag: 0x00ABCD01}})
	a.post(SendWR{ID: 2, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 64}}})
	wc := a.wait(a.scq)
	if wc.ID != 1 || wc.Status != StatusRemoteTermination {
		t.Fatalf("read completion %+v", wc)
	}
	// The Send may have gone out before the Terminate came back (then it
	// succeeded) or not (then it is flushed); it never carries the error.
	wc = a.wait(a.scq)
	if wc.ID != 2 || (wc.Status != StatusFlushed && wc.Status != StatusSuccess) {
		t.Fatalf("later send %+v", wc)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtInvalidSTag}
	ev := a.waitEvent(EventTerminateReceived)
	if ev.Terminate == nil || ev.Terminate.Local || ev.Terminate.Fields.Cause != want {
		t.Fatalf("requester event %+v", ev)
	}
	if ev := b.waitEvent(EventIRRQInvalidSTag); ev.Terminate.Fields.Cause != want || !ev.Terminate.Local {
		t.Fatalf("source event %+v", ev)
	}
	a.waitState(StateError)
	b.waitState(StateError)
	if q := a.qp.Query(); q.Terminate == nil || q.Terminate.Local || q.Terminate.Fields.Cause != want {
		t.Fatalf("requester Query terminate %+v", q.Terminate)
	}
	if q := b.qp.Query(); q.Terminate == nil || !q.Terminate.Local {
		t.Fatalf("source Query terminate %+v", q.Terminate)
	}
}

// TestRemoteErrorWriteBounds: a Write past the end of the sink. The Write
// completes locally (it was handed to TCP); the sink terminates with DDP
// Tagged / Base or Bounds; the writer sees Terminate Message Received.
func TestRemoteErrorWriteBounds(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	src, _ := a.reg(8192, LocalRead)
	sink, sinkBuf := b.reg(4096, LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 1, Op: WRWrite, SGL: []SGE{{STag: src.STag(), Len: 8192}}, Remote: RemoteAddr{STag: sink.STag()}})
	a.waitOK(a.scq, WRWrite)
	want := term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedBaseBounds}
	if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Fields.Cause != want {
		t.Fatalf("writer event %+v", ev)
	}
	if ev := b.waitEvent(EventBaseBounds); ev.Terminate.Fields.Cause != want {
		t.Fatalf("sink event %+v", ev)
	}
	for i, v := range sinkBuf {
		if v != 0 {
			t.Fatalf("sink written at %d", i)
		}
	}
	a.waitState(StateError)
	b.waitState(StateError)
}

// TestLocalErrorBadSGE: a Send from an unregistered local STag completes
// with Invalid STag, the peer receives a Terminate RDMAP Local Catastrophic,
// and only the failing WR reports an error (later ones are flushed). No
// asynchronous event is raised locally: the completion reports it.
func TestLocalErrorBadSGE(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		b.postRecv(1, bRecv, 64)
		b.postRecv(2, bRecv, 64)
	})
	msg, _ := a.reg(64, LocalRead)
	noLR, _ := a.reg(64, LocalWrite)
	// One list: the failing WR moves the QP to Terminate at once (it may be
	// processed inside PostSend), after which posting is refused.
	if n, err := a.qp.PostSend(
		SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 8}}},
		SendWR{ID: 2, Op: WRSend, Unsignaled: true, SGL: []SGE{{STag: noLR.STag(), Len: 8}}},
		SendWR{ID: 3, Op: WRSend, Unsignaled: true, SGL: []SGE{{STag: msg.STag(), Len: 8}}}); n != 3 || err != nil {
		t.Fatalf("posted %d: %v", n, err)
	}
	for _, want := range []struct {
		id uint64
		st Status
	}{{1, StatusSuccess}, {2, StatusAccessViolation}, {3, StatusFlushed}} {
		wc := a.wait(a.scq)
		if wc.ID != want.id || wc.Status != want.st {
			t.Fatalf("completion %+v, want id %d %s", wc, want.id, want.st)
		}
	}
	b.waitOK(b.rcq, WRRecv)
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}
	if ev := b.waitEvent(EventTerminateReceived); ev.Terminate.Fields.Cause != want {
		t.Fatalf("peer event %+v", ev)
	}
	a.waitState(StateError)
	b.waitState(StateError)
	if wc := b.wait(b.rcq); wc.ID != 2 || wc.Status != StatusFlushed {
		t.Fatalf("peer's second receive %+v", wc)
	}
	for _, ev := range a.eventTypes() {
		if ev != EventLLPCloseComplete {
			t.Fatalf("local side raised %s for an error its completion reported", ev)
		}
	}
}

// TestSendWithoutReceive: a Send finding no posted receive is fatal (RFC
// 5040 §5.3: iWARP has no RNR retry).
func TestSendWithoutReceive(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	msg, _ := a.reg(64, LocalRead)
	a.post(SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 8}}})
	a.waitOK(a.scq, WRSend)
	want := term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer}
	if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Fields.Cause != want {
		t.Fatalf("sender event %+v", ev)
	}
	if ev := b.waitEvent(EventRQInvalidMSN); ev.Terminate.Fields.Cause != want {
		t.Fatalf("receiver event %+v", ev)
	}
}

// TestMisalignedAtomicBetweenEngines: a Fetch-and-Add at a TO that is not a
// multiple of 8 (RFC 7306 §8.2).
func TestMisalignedAtomicBetweenEngines(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	word, wordBuf := b.reg(64, LocalWrite|RemoteAtomic)
	res, _ := a.reg(8, LocalWrite)
	a.post(SendWR{ID: 1, Op: WRFetchAdd, Local: SGE{STag: res.STag(), Len: 8}, Remote: RemoteAddr{STag: word.STag(), TO: 12}, AddSwap: 1})
	wc := a.wait(a.scq)
	if wc.Status != StatusRemoteTermination {
		t.Fatalf("atomic %+v", wc)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpCatastrophicStream}
	if ev := b.waitEvent(EventMisalignedAtomic); ev.Terminate.Fields.Cause != want {
		t.Fatalf("target event %+v", ev)
	}
	for i, v := range wordBuf {
		if v != 0 {
			t.Fatalf("target memory changed at %d", i)
		}
	}
}
