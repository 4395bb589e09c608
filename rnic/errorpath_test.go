package rnic

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/rdmap"
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
	// One list: the Terminate may come back before a later PostSend.
	if k, err := a.qp.PostSend(
		SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 4096}, Remote: RemoteAddr{STag: 0x00ABCD01}},
		SendWR{ID: 2, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 64}}}); k != 2 || err != nil {
		t.Fatalf("posted %d: %v", k, err)
	}
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
	if ev.Terminate == nil || ev.TerminateSent || ev.Terminate.Cause != want {
		t.Fatalf("requester event %+v", ev)
	}
	if ev := b.waitEvent(EventIRRQInvalidSTag); ev.Terminate.Cause != want || !ev.TerminateSent {
		t.Fatalf("source event %+v", ev)
	}
	a.waitState(StateError)
	b.waitState(StateError)
	if q := a.qp.Query(); q.Terminate == nil || q.TerminateSent || q.Terminate.Cause != want {
		t.Fatalf("requester Query terminate %+v", q.Terminate)
	}
	if q := b.qp.Query(); q.Terminate == nil || !q.TerminateSent {
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
	if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Cause != want {
		t.Fatalf("writer event %+v", ev)
	}
	if ev := b.waitEvent(EventBaseBounds); ev.Terminate.Cause != want {
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
	if ev := b.waitEvent(EventTerminateReceived); ev.Terminate.Cause != want {
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
	if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Cause != want {
		t.Fatalf("sender event %+v", ev)
	}
	if ev := b.waitEvent(EventRQInvalidMSN); ev.Terminate.Cause != want {
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
	if ev := b.waitEvent(EventMisalignedAtomic); ev.Terminate.Cause != want {
		t.Fatalf("target event %+v", ev)
	}
	for i, v := range wordBuf {
		if v != 0 {
			t.Fatalf("target memory changed at %d", i)
		}
	}
}

// remoteErrCase is one error path between two engines: a (the requester)
// posts WR 1, which b (the responder) refuses with a Terminate.
type remoteErrCase struct {
	name string
	o    pairOpts
	// post registers b's target and posts the failing WR on a; it returns
	// b's buffer that must stay untouched (or nil).
	post   func(t *testing.T, a, b *side) []byte
	status Status // of WR 1 on a (a Write completes once handed to TCP)
	cause  term.Cause
	ev     EventType // on b
}

func remoteErrCases() []remoteErrCase {
	write := func(stag func(b *side) (STag, uint64, []byte)) func(t *testing.T, a, b *side) []byte {
		return func(t *testing.T, a, b *side) []byte {
			src, _ := a.reg(64, LocalRead)
			st, to, buf := stag(b)
			a.post(SendWR{ID: 1, Op: WRWrite, SGL: []SGE{{STag: src.STag(), Len: 8}}, Remote: RemoteAddr{STag: st, TO: to}})
			return buf
		}
	}
	read := func(stag func(b *side) (STag, uint64, []byte)) func(t *testing.T, a, b *side) []byte {
		return func(t *testing.T, a, b *side) []byte {
			sink, _ := a.reg(64, LocalWrite|RemoteWrite)
			st, to, buf := stag(b)
			a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 16}, Remote: RemoteAddr{STag: st, TO: to}})
			return buf
		}
	}
	atomic := func(stag func(b *side) (STag, uint64, []byte)) func(t *testing.T, a, b *side) []byte {
		return func(t *testing.T, a, b *side) []byte {
			res, _ := a.reg(8, LocalWrite)
			st, to, buf := stag(b)
			a.post(SendWR{ID: 1, Op: WRFetchAdd, Local: SGE{STag: res.STag(), Len: 8}, Remote: RemoteAddr{STag: st, TO: to}, AddSwap: 1})
			return buf
		}
	}
	all := LocalRead | LocalWrite | RemoteRead | RemoteWrite | RemoteAtomic
	wrongKey := func(b *side) (STag, uint64, []byte) {
		mr, buf := b.reg(64, all)
		return mr.STag().WithKey(mr.STag().Key() ^ 0x5a), 0, buf
	}
	otherPD := func(b *side) (STag, uint64, []byte) {
		pd, err := b.dev.AllocPD()
		if err != nil {
			b.t.Fatal(err)
		}
		buf := make([]byte, 64)
		mr, err := pd.RegisterBytes(buf, all)
		if err != nil {
			b.t.Fatal(err)
		}
		return mr.STag(), 0, buf
	}
	rights := func(acc Access) func(b *side) (STag, uint64, []byte) {
		return func(b *side) (STag, uint64, []byte) {
			mr, buf := b.reg(64, acc)
			return mr.STag(), 0, buf
		}
	}
	wrap := func(b *side) (STag, uint64, []byte) {
		buf := make([]byte, 4096)
		mr, err := b.pd.RegisterMR(Bytes(buf), MROptions{Access: all, VA: math.MaxUint64 - 4095})
		if err != nil {
			b.t.Fatal(err)
		}
		return mr.STag(), math.MaxUint64 - 3, buf
	}
	invalidated := func(b *side) (STag, uint64, []byte) {
		mr, buf := b.reg(64, all)
		if err := mr.Invalidate(); err != nil {
			b.t.Fatal(err)
		}
		return mr.STag(), 0, buf
	}
	rt := StatusRemoteTermination
	return []remoteErrCase{
		{name: "write-wrong-key", post: write(wrongKey), cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag},
		{name: "read-wrong-key", post: read(wrongKey), status: rt, cause: prot(term.ProtInvalidSTag), ev: EventIRRQInvalidSTag},
		{name: "atomic-wrong-key", post: atomic(wrongKey), status: rt, cause: prot(term.ProtInvalidSTag), ev: EventIRRQInvalidSTag},
		{name: "write-other-pd", post: write(otherPD), cause: ddpTagged(term.TaggedNotAssociated), ev: EventInvalidPD},
		{name: "read-other-pd", post: read(otherPD), status: rt, cause: prot(term.ProtSTagNotAssociated), ev: EventIRRQInvalidPD},
		{name: "atomic-other-pd", post: atomic(otherPD), status: rt, cause: prot(term.ProtSTagNotAssociated), ev: EventIRRQInvalidPD},
		{name: "write-no-remote-write", post: write(rights(LocalRead | LocalWrite | RemoteRead)), cause: ddpTagged(term.TaggedInvalidSTag), ev: EventAccessRights},
		{name: "read-no-remote-read", post: read(rights(LocalRead | LocalWrite | RemoteWrite)), status: rt, cause: prot(term.ProtAccessRights), ev: EventIRRQAccessRights},
		{name: "atomic-no-remote-atomic", post: atomic(rights(LocalRead | LocalWrite | RemoteWrite)), status: rt, cause: prot(term.ProtAccessRights), ev: EventIRRQAccessRights},
		{name: "write-to-wrap", post: write(wrap), cause: ddpTagged(term.TaggedTOWrap), ev: EventWrap},
		{name: "read-to-wrap", post: read(wrap), status: rt, cause: prot(term.ProtTOWrap), ev: EventIRRQWrap},
		{name: "write-invalidated", post: write(invalidated), cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag},
		{name: "read-invalidated", post: read(invalidated), status: rt, cause: prot(term.ProtInvalidSTag), ev: EventIRRQInvalidSTag},
		{name: "atomic-invalidated", post: atomic(invalidated), status: rt, cause: prot(term.ProtInvalidSTag), ev: EventIRRQInvalidSTag},
		{name: "atomic-misaligned", post: atomic(func(b *side) (STag, uint64, []byte) {
			mr, buf := b.reg(64, all)
			return mr.STag(), 12, buf
		}), status: rt, cause: remoteOp(term.OpCatastrophicStream), ev: EventMisalignedAtomic},
		{name: "atomic-misaligned-rev1-nocrc", o: pairOpts{rev: 1, noCRC: true}, post: atomic(func(b *side) (STag, uint64, []byte) {
			mr, buf := b.reg(64, all)
			return mr.STag(), 4, buf
		}), status: rt, cause: remoteOp(term.OpCatastrophicStream), ev: EventMisalignedAtomic},
	}
}

// TestRemoteErrorBothSides: every inbound check failure between two
// engines, checked at both ends: the requester's completion status, its
// Terminate Message Received event and the received Terminate in Query QP;
// the responder's event, the Terminate it sent and Query QP; both QPs in
// Error with nothing else raised, and the target memory untouched.
func TestRemoteErrorBothSides(t *testing.T) {
	for _, c := range remoteErrCases() {
		t.Run(c.name, func(t *testing.T) {
			a, b := newPair(t, c.o, nil)
			buf := c.post(t, a, b)
			before := bytes.Clone(buf)
			wc := a.wait(a.scq)
			if wc.ID != 1 || wc.Status != c.status {
				t.Fatalf("requester completion %+v, want %s", wc, c.status)
			}
			ev := a.waitEvent(EventTerminateReceived)
			if ev.Terminate == nil || ev.TerminateSent || ev.Terminate.Cause != c.cause || ev.QP != a.qp || ev.Resource != ResourceQP {
				t.Fatalf("requester event %+v, want cause %s", ev, c.cause)
			}
			ev = b.waitEvent(c.ev)
			if ev.Terminate == nil || !ev.TerminateSent || ev.Terminate.Cause != c.cause || ev.QP != b.qp {
				t.Fatalf("responder event %+v, want cause %s", ev, c.cause)
			}
			a.waitState(StateError)
			b.waitState(StateError)
			if q := a.qp.Query(); q.Terminate == nil || q.TerminateSent || q.Terminate.Cause != c.cause {
				t.Fatalf("requester Query terminate %+v", q.Terminate)
			}
			if q := b.qp.Query(); q.Terminate == nil || !q.TerminateSent || q.Terminate.Cause != c.cause {
				t.Fatalf("responder Query terminate %+v", q.Terminate)
			}
			if evs := a.eventTypes(); len(evs) != 1 {
				t.Fatalf("requester events %v", evs)
			}
			if evs := b.eventTypes(); len(evs) != 1 {
				t.Fatalf("responder events %v", evs)
			}
			if !bytes.Equal(buf, before) {
				t.Fatal("target memory changed")
			}
		})
	}
}

// TestIRDExceeded: a requester whose ORD exceeds the responder's IRD.
// With MPA revision 2 the RFC 6581 exchange prevents it: the requester's
// ORD is clamped to the responder's IRD and extra Reads stall, all
// succeeding. With revision 1 (no IRD/ORD exchange) the (IRD+1)-th Read
// Request is refused: the responder terminates with DDP Untagged / Invalid
// MSN - no buffer (RFC 5040 §7.2; §6.1: the IRD bounds the outstanding
// inbound Read Requests) and raises IRRQ
// Protection Error - too many Read Requests; the requester's Read that
// overflowed completes with Remote Termination Error, later ones flushed.
func TestIRDExceeded(t *testing.T) {
	const n, size = 4, 1 << 20
	run := func(t *testing.T, rev int) (*side, *side, []WC) {
		o := pairOpts{rev: rev, qp: QPConfig{IRD: 1, ORD: 8, InboundRead: true, InboundWrite: true}}
		a, b := newPair(t, o, nil)
		src, _ := b.reg(size, LocalRead|RemoteRead)
		sink, _ := a.reg(n*size, LocalWrite|RemoteWrite)
		// One list: the Terminate may come back before a later PostSend.
		wrs := make([]SendWR, n)
		for i := range wrs {
			wrs[i] = SendWR{ID: uint64(i), Op: WRRead, Local: SGE{STag: sink.STag(), TO: uint64(i * size), Len: size}, Remote: RemoteAddr{STag: src.STag()}}
		}
		if k, err := a.qp.PostSend(wrs...); k != n || err != nil {
			t.Fatalf("posted %d: %v", k, err)
		}
		var wcs []WC
		for i := 0; i < n; i++ {
			wcs = append(wcs, a.wait(a.scq))
		}
		return a, b, wcs
	}
	t.Run("rev2-negotiated", func(t *testing.T) {
		a, b, wcs := run(t, 2)
		if q := a.qp.Query(); q.ORD != 1 {
			t.Fatalf("requester ORD %d, want the responder's IRD 1", q.ORD)
		}
		for i, wc := range wcs {
			if wc.ID != uint64(i) || wc.Status != StatusSuccess {
				t.Fatalf("read %d: %+v", i, wc)
			}
		}
		if evs := append(a.eventTypes(), b.eventTypes()...); len(evs) != 0 {
			t.Fatalf("events %v", evs)
		}
	})
	t.Run("rev1-exceeded", func(t *testing.T) {
		a, b, wcs := run(t, 1)
		if q := a.qp.Query(); q.ORD != 8 {
			t.Fatalf("requester ORD %d (no negotiation in revision 1)", q.ORD)
		}
		cause := ddpUntagged(term.UntaggedNoBuffer)
		if ev := b.waitEvent(EventIRRQTooMany); ev.Terminate == nil || !ev.TerminateSent || ev.Terminate.Cause != cause {
			t.Fatalf("responder event %+v", ev)
		}
		ev := a.waitEvent(EventTerminateReceived)
		f := ev.Terminate
		if ev.TerminateSent || f.Cause != cause || !f.D || len(f.DDPHeader) != ddp.UntaggedHeaderLen {
			t.Fatalf("requester event %+v", ev)
		}
		// The refused request is the one whose header the Terminate echoes
		// (MSN k+1 for Read k: no RTR in revision 1); usually the second,
		// unless the first response went out whole before it arrived. Reads
		// before it succeeded or were cut short (Flushed), reads after it
		// are Flushed.
		h := ddp.Untagged(f.DDPHeader)
		k := int(h.MSN()) - 1
		if h.QN() != rdmap.QNReadRequest || k < 1 || k >= n {
			t.Fatalf("echoed header QN %d MSN %d", h.QN(), h.MSN())
		}
		for i, wc := range wcs {
			ok := wc.Status == StatusFlushed
			switch {
			case i < k:
				ok = ok || wc.Status == StatusSuccess
			case i == k:
				ok = wc.Status == StatusRemoteTermination
			}
			if wc.ID != uint64(i) || !ok {
				t.Fatalf("read %d (the refused one is %d): %+v", i, k, wc)
			}
		}
		a.waitState(StateError)
		b.waitState(StateError)
	})
}

// flushedRecvs waits for k receive completions on s, all Flushed.
func flushedRecvs(t *testing.T, s *side, k int) {
	t.Helper()
	for i := 0; i < k; i++ {
		if wc := s.wait(s.rcq); wc.Status != StatusFlushed || wc.Op != WRRecv {
			t.Fatalf("%s: receive %+v, want flushed", s.dev.Name(), wc)
		}
	}
}

// TestModifyRTSToError: Modify QP RTS->Error resets the stream without a
// Terminate (draft Fig. 12): when it returns the QP is in Error with every
// outstanding WR flushed and no event raised; the peer sees LLP Connection
// Reset, goes to Error and flushes its own WRs. A relay holds the peer's
// Read Responses after 1 MiB, so the reset comes while the peer is sending
// the first.
func TestModifyRTSToError(t *testing.T) {
	const big = 16 << 20
	var px *proxy
	var aRecv, bRecv *MR
	a, b := newPair(t, pairOpts{proxy: &px}, func(a, b *side) {
		aRecv, _ = a.reg(64, LocalWrite)
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 3; i++ {
			a.postRecv(i, aRecv, 64)
			b.postRecv(i, bRecv, 64)
		}
	})
	src, _ := b.reg(big, LocalRead|RemoteRead)
	sink, _ := a.reg(big, LocalWrite|RemoteWrite)
	ca, cb := a.stream(), b.stream()
	held := px.hold(1 << 20)
	for i := uint64(10); i < 13; i++ {
		a.post(SendWR{ID: i, Op: WRRead, Local: SGE{STag: sink.STag(), Len: big}, Remote: RemoteAddr{STag: src.STag()}})
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the Read Responses did not reach the relay")
	}
	if err := a.qp.Modify(StateError, ModifyAttrs{}); err != nil {
		t.Fatal(err)
	}
	if st := a.qp.State(); st != StateError {
		t.Fatalf("state %s when Modify returned", st)
	}
	wcs := drainCQ(a.scq)
	if len(wcs) != 3 {
		t.Fatalf("%d send completions when Modify returned: %+v", len(wcs), wcs)
	}
	for _, wc := range wcs {
		if wc.Status != StatusFlushed {
			t.Fatalf("reads %+v: the outstanding ones must be flushed", wcs)
		}
	}
	flushedRecvs(t, a, 3)
	b.waitEvent(EventLLPConnectionReset)
	b.waitState(StateError)
	flushedRecvs(t, b, 3)
	if q := a.qp.Query(); q.Terminate != nil {
		t.Fatalf("a Terminate was recorded: %+v", q.Terminate)
	}
	if q := b.qp.Query(); q.Terminate != nil {
		t.Fatalf("the peer recorded a Terminate: %+v", q.Terminate)
	}
	a.settle(ca)
	b.settle(cb)
	if evs := a.eventTypes(); len(evs) != 0 {
		t.Fatalf("events on the QP moved to Error: %v", evs)
	}
	if evs := b.eventTypes(); len(evs) != 1 {
		t.Fatalf("peer events %v", evs)
	}
}

// TestModifyRTSToTerminate: Modify QP RTS->Terminate sends a Terminate with
// RDMAP Local Catastrophic Error and no headers (draft Fig. 12), then the
// QP goes to Error with its WRs flushed and no event (the consumer asked
// for it); the peer raises Terminate Message Received, records the
// Terminate and goes to Error with its WRs flushed.
func TestModifyRTSToTerminate(t *testing.T) {
	var aRecv, bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		aRecv, _ = a.reg(64, LocalWrite)
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 2; i++ {
			a.postRecv(i, aRecv, 64)
			b.postRecv(i, bRecv, 64)
		}
	})
	ca, cb := a.stream(), b.stream()
	if err := a.qp.Modify(StateTerminate, ModifyAttrs{}); err != nil {
		t.Fatal(err)
	}
	if st := a.qp.State(); st != StateTerminate && st != StateError {
		t.Fatalf("state %s after Modify", st)
	}
	if _, err := a.qp.PostSend(SendWR{ID: 1, Op: WRSend}); !errors.Is(err, ErrInvalidQPState) {
		t.Fatalf("post in Terminate: %v", err)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}
	ev := b.waitEvent(EventTerminateReceived)
	if ev.Terminate == nil || ev.TerminateSent || ev.Terminate.Cause != want || ev.Terminate.D || ev.Terminate.M {
		t.Fatalf("peer event %+v", ev)
	}
	a.waitState(StateError)
	b.waitState(StateError)
	flushedRecvs(t, a, 2)
	flushedRecvs(t, b, 2)
	if q := a.qp.Query(); q.Terminate == nil || !q.TerminateSent || q.Terminate.Cause != want {
		t.Fatalf("local Query terminate %+v", q.Terminate)
	}
	if q := b.qp.Query(); q.Terminate == nil || q.TerminateSent || q.Terminate.Cause != want {
		t.Fatalf("peer Query terminate %+v", q.Terminate)
	}
	a.settle(ca)
	b.settle(cb)
	if evs := a.eventTypes(); len(evs) != 0 {
		t.Fatalf("events on the terminating QP: %v", evs)
	}
	if evs := b.eventTypes(); len(evs) != 1 {
		t.Fatalf("peer events %v", evs)
	}
}

// TestLLPReset: the TCP connection is reset under two live QPs (a relay
// between them sends RST both ways). Each raises LLP Connection Reset, goes
// to Error with no Terminate, and flushes its outstanding WRs.
func TestLLPReset(t *testing.T) {
	var px *proxy
	var aRecv, bRecv *MR
	a, b := newPair(t, pairOpts{proxy: &px}, func(a, b *side) {
		aRecv, _ = a.reg(64, LocalWrite)
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 2; i++ {
			a.postRecv(i, aRecv, 64)
			b.postRecv(i, bRecv, 64)
		}
	})
	exchangeSend := func(from, to *side) {
		from.post(SendWR{ID: 7, Op: WRSend})
		from.waitOK(from.scq, WRSend)
		to.waitOK(to.rcq, WRRecv)
	}
	exchangeSend(a, b) // the relay carries traffic
	exchangeSend(b, a)
	px.reset()
	for _, s := range []*side{a, b} {
		ev := s.waitEvent(EventLLPConnectionReset)
		if ev.QP != s.qp || ev.Resource != ResourceQP {
			t.Fatalf("%s: event %+v", s.dev.Name(), ev)
		}
		s.waitState(StateError)
		flushedRecvs(t, s, 1)
		if q := s.qp.Query(); q.Terminate != nil {
			t.Fatalf("%s: Terminate recorded %+v", s.dev.Name(), q.Terminate)
		}
		if evs := s.eventTypes(); len(evs) != 1 {
			t.Fatalf("%s: events %v", s.dev.Name(), evs)
		}
	}
}
