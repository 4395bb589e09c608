package rnic

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Verbs-level behaviour (draft-hilland-rddp-verbs): memory windows,
// fast-register and invalidation, CQ notification, resize and overflow, the
// QP state machine and flushing, S-RQ limits, fences, and atomics from
// several QPs at once. rnic/CHECKLIST.md points here item by item.

// TestMemoryWindowLifecycle: allocate, bind (with a new key) to a part of a
// region, remote Write and Read through the window at zero-based offsets,
// the region cannot be deallocated while the window is bound, local
// invalidate, and an access through the invalidated window is refused
// without touching memory.
func TestMemoryWindowLifecycle(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	// Windows bind to VA-based regions (rnic/CHECKLIST.md, C11.13).
	mrBuf := make([]byte, 64<<10)
	mr, err := b.pd.RegisterMR(Bytes(mrBuf), MROptions{Access: LocalRead | LocalWrite | MWBind, VA: 0x7000_0000})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := mw.Query(); info.Valid {
		t.Fatal("a fresh window is valid")
	}
	win := mw.STag().WithKey(0x5a)
	b.post(SendWR{ID: 1, Op: WRBindMW, Bind: &BindMW{MW: win, MR: mr.STag(), ZeroBased: true, VA: 0x7000_0000 + 4096, Len: 8192,
		Access: RemoteRead | RemoteWrite}})
	b.waitOK(b.scq, WRBindMW)
	info, err := mw.Query()
	if err != nil || !info.Valid || info.STag != win || info.Len != 8192 || info.QPID != b.qp.ID() || info.MR != mr.STag() {
		t.Fatalf("bound window %+v %v", info, err)
	}
	if err := mr.Dealloc(); !errors.Is(err, ErrMWBound) {
		t.Fatalf("dealloc of a region with a bound window: %v", err)
	}

	src, srcBuf := a.reg(8192, LocalRead|LocalWrite)
	fill(srcBuf, 7)
	a.post(SendWR{ID: 1, Op: WRWrite, SGL: []SGE{{STag: src.STag(), Len: 8192}}, Remote: RemoteAddr{STag: win, TO: 0}})
	a.waitOK(a.scq, WRWrite)
	back, backBuf := a.reg(8192, LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 2, Op: WRRead, Local: SGE{STag: back.STag(), Len: 8192}, Remote: RemoteAddr{STag: win, TO: 0}})
	a.waitOK(a.scq, WRRead)
	if !bytes.Equal(mrBuf[4096:4096+8192], srcBuf) || !bytes.Equal(backBuf, srcBuf) {
		t.Fatal("data through the window differs")
	}
	for i, v := range append(mrBuf[:4096:4096], mrBuf[4096+8192:]...) {
		if v != 0 {
			t.Fatalf("byte %d outside the window written", i)
		}
	}

	b.post(SendWR{ID: 2, Op: WRInvalidate, InvalidateSTag: win})
	b.waitOK(b.scq, WRInvalidate)
	if info, _ := mw.Query(); info.Valid {
		t.Fatal("window valid after invalidate")
	}
	before := bytes.Clone(mrBuf)
	fill(srcBuf, 8)
	a.post(SendWR{ID: 3, Op: WRRead, Local: SGE{STag: back.STag(), Len: 16}, Remote: RemoteAddr{STag: win}})
	if wc := a.wait(a.scq); wc.ID != 3 || wc.Status != StatusRemoteTermination {
		t.Fatalf("read through an invalidated window: %+v", wc)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtInvalidSTag}
	if ev := b.waitEvent(EventIRRQInvalidSTag); ev.Terminate.Cause != want {
		t.Fatalf("responder event %+v", ev)
	}
	if !bytes.Equal(mrBuf, before) {
		t.Fatal("memory changed by a refused access")
	}
	if err := mw.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Dealloc(); err != nil {
		t.Fatalf("dealloc after the window went: %v", err)
	}
}

// TestMemoryWindowRemoteInvalidate: a Send with Invalidate naming a bound
// window invalidates it; the receive completion reports the STag.
func TestMemoryWindowRemoteInvalidate(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		b.postRecv(1, bRecv, 64)
	})
	mr, err := b.pd.RegisterMR(Bytes(make([]byte, 4096)), MROptions{Access: LocalRead | LocalWrite | MWBind, VA: 0x10000})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	win := mw.STag().WithKey(b.dev.RandomKey())
	b.post(SendWR{ID: 1, Op: WRBindMW, Bind: &BindMW{MW: win, MR: mr.STag(), ZeroBased: true, VA: 0x10000, Len: 4096, Access: RemoteWrite}})
	b.waitOK(b.scq, WRBindMW)
	a.post(SendWR{ID: 1, Op: WRSendInv, InvalidateSTag: win})
	a.waitOK(a.scq, WRSendInv)
	wc := b.waitOK(b.rcq, WRRecv)
	if !wc.HasInvalidated || wc.Invalidated != win {
		t.Fatalf("receive %+v", wc)
	}
	if info, _ := mw.Query(); info.Valid {
		t.Fatal("window valid after Send with Invalidate")
	}
}

// TestFastRegisterAndInvalidate: an STag allocated without memory, fast-
// registered by a work request with a fresh key, read remotely, locally
// invalidated, and refused afterwards; the old key is refused too.
func TestFastRegisterAndInvalidate(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	mr, err := b.pd.AllocMRSTag(16, true)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := mr.Query(); info.Valid {
		t.Fatal("allocated STag is valid before fast-register")
	}
	buf := make([]byte, 12288)
	fill(buf, 9)
	stag := mr.STag().WithKey(0x77)
	b.post(SendWR{ID: 1, Op: WRFastReg, FastReg: &FastReg{STag: stag, Mem: Bytes(buf), ZeroBased: true,
		Access: LocalRead | LocalWrite | RemoteRead}})
	b.waitOK(b.scq, WRFastReg)
	if info, _ := mr.Query(); !info.Valid || info.STag != stag || info.Len != uint64(len(buf)) {
		t.Fatalf("after fast-register %+v", info)
	}
	sink, sinkBuf := a.reg(len(buf), LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: uint32(len(buf))}, Remote: RemoteAddr{STag: stag}})
	a.waitOK(a.scq, WRRead)
	if !bytes.Equal(sinkBuf, buf) {
		t.Fatal("read of the fast-registered region differs")
	}
	b.post(SendWR{ID: 2, Op: WRInvalidate, InvalidateSTag: stag})
	b.waitOK(b.scq, WRInvalidate)
	if info, _ := mr.Query(); info.Valid {
		t.Fatal("valid after local invalidate")
	}
	a.post(SendWR{ID: 2, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 16}, Remote: RemoteAddr{STag: stag}})
	if wc := a.wait(a.scq); wc.Status != StatusRemoteTermination {
		t.Fatalf("read of an invalidated STag: %+v", wc)
	}
}

// idleQP makes a QP that never connects, for state-machine tests.
func idleQP(t *testing.T, cqEntries, depth int) (*Device, *PD, *CQ, *QP, *MR, chan AsyncEvent) {
	t.Helper()
	evs := make(chan AsyncEvent, 16)
	cfg := DefaultConfig()
	cfg.Logger = testLogger()
	cfg.AsyncHandler = func(ev AsyncEvent) { evs <- ev }
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	pd, _ := d.AllocPD()
	cq, err := d.CreateCQ(cqEntries, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SQDepth: depth, RQDepth: depth, MaxSendSGE: 4, MaxRecvSGE: 4})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegisterBytes(make([]byte, 4096), LocalRead|LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return d, pd, cq, qp, mr, evs
}

// TestQPStateMachine: transitions the draft allows and refuses from Idle
// and Error, WRs posted in Idle flushed by Idle->Error, WRs posted in Error
// flushed at once, and Error->Idle.
func TestQPStateMachine(t *testing.T) {
	_, _, cq, qp, mr, _ := idleQP(t, 64, 16)
	if qp.State() != StateIdle {
		t.Fatalf("new QP in %s", qp.State())
	}
	if err := qp.Modify(StateRTS, ModifyAttrs{}); !errors.Is(err, ErrInvalidStream) {
		t.Fatalf("Idle->RTS without a stream: %v", err)
	}
	for _, s := range []QPState{StateClosing, StateTerminate} {
		if err := qp.Modify(s, ModifyAttrs{}); !errors.Is(err, ErrInvalidStateChange) {
			t.Fatalf("Idle->%s: %v", s, err)
		}
	}
	if err := qp.Modify(StateIdle, ModifyAttrs{ORD: 4, IRD: 4}); err != nil {
		t.Fatalf("Idle->Idle with new IRD/ORD: %v", err)
	}
	if q := qp.Query(); q.IRD != 4 || q.ORD != 4 {
		t.Fatalf("IRD/ORD %d/%d", q.IRD, q.ORD)
	}
	const sends, recvs = 5, 7
	for i := uint64(0); i < sends; i++ {
		if _, err := qp.PostSend(SendWR{ID: 100 + i, Op: WRSend, SGL: []SGE{{STag: mr.STag(), Len: 8}}}); err != nil {
			t.Fatalf("post send in Idle: %v", err)
		}
	}
	for i := uint64(0); i < recvs; i++ {
		if _, err := qp.PostRecv(RecvWR{ID: 200 + i, SGL: []SGE{{STag: mr.STag(), Len: 8}}}); err != nil {
			t.Fatalf("post recv in Idle: %v", err)
		}
	}
	if len(drainCQ(cq)) != 0 {
		t.Fatal("completions before any transition")
	}
	if err := qp.Modify(StateError, ModifyAttrs{}); err != nil {
		t.Fatal(err)
	}
	wcs := drainCQ(cq)
	if len(wcs) != sends+recvs {
		t.Fatalf("%d completions after flush, want %d", len(wcs), sends+recvs)
	}
	var sq, rq []uint64
	for _, wc := range wcs {
		if wc.Status != StatusFlushed {
			t.Fatalf("flushed WR %+v", wc)
		}
		if wc.Op == WRRecv {
			rq = append(rq, wc.ID)
		} else {
			sq = append(sq, wc.ID)
		}
	}
	if !sort.SliceIsSorted(sq, func(i, j int) bool { return sq[i] < sq[j] }) || !sort.SliceIsSorted(rq, func(i, j int) bool { return rq[i] < rq[j] }) {
		t.Fatalf("flush order sq %v rq %v", sq, rq)
	}
	// In Error a new WR is refused at once (the draft allows an immediate
	// error or enqueue-and-flush; we refuse, leaving nothing behind).
	if _, err := qp.PostSend(SendWR{ID: 300, Op: WRSend}); !errors.Is(err, ErrInvalidQPState) {
		t.Fatalf("post send in Error: %v", err)
	}
	if _, err := qp.PostRecv(RecvWR{ID: 301}); !errors.Is(err, ErrInvalidQPState) {
		t.Fatalf("post recv in Error: %v", err)
	}
	if wcs := drainCQ(cq); len(wcs) != 0 {
		t.Fatalf("completions for refused WRs: %+v", wcs)
	}
	if err := qp.Modify(StateRTS, ModifyAttrs{}); !errors.Is(err, ErrInvalidStateChange) {
		t.Fatalf("Error->RTS: %v", err)
	}
	if err := qp.Modify(StateIdle, ModifyAttrs{}); err != nil {
		t.Fatalf("Error->Idle: %v", err)
	}
	if qp.State() != StateIdle {
		t.Fatalf("state %s", qp.State())
	}
}

// TestFlushKOfN: n Sends against k posted receives. The peer terminates on
// the first Send without a receive (RFC 5040 §5.3); every one of the n WRs
// completes exactly once, the successes first, and the receiver got k.
func TestFlushKOfN(t *testing.T) {
	const n, k = 12, 5
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < k; i++ {
			b.postRecv(i, bRecv, 64)
		}
	})
	// Plugged: all n are queued before the first leaves, so the Terminate
	// the sixth one causes cannot come back while they are being posted.
	a.qp.Plug()
	for i := uint64(0); i < n; i++ {
		a.post(SendWR{ID: i, Op: WRSend})
	}
	a.qp.Unplug()
	var got []WC
	for len(got) < n {
		got = append(got, a.wait(a.scq))
	}
	successes := 0
	for i, wc := range got {
		if wc.ID != uint64(i) {
			t.Fatalf("completion %d is WR %d", i, wc.ID)
		}
		if wc.Status == StatusSuccess {
			if successes != i {
				t.Fatalf("success after a failure: %+v", got)
			}
			successes++
		} else if wc.Status != StatusFlushed && wc.Status != StatusRemoteTermination {
			t.Fatalf("status %+v", wc)
		}
	}
	// A Send completes when handed to TCP, so Sends behind the fatal one
	// may still succeed locally before the Terminate comes back.
	if successes < k {
		t.Fatalf("%d of %d sends succeeded with %d receives", successes, n, k)
	}
	a.waitState(StateError)
	b.waitState(StateError)
	recvd := 0
	for _, wc := range drainCQ(b.rcq) {
		if wc.Status == StatusSuccess {
			recvd++
		}
	}
	if recvd != k {
		t.Fatalf("receiver completed %d receives, want %d", recvd, k)
	}
	want := term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer}
	if ev := b.waitEvent(EventRQInvalidMSN); ev.Terminate == nil || ev.Terminate.Cause != want {
		t.Fatalf("receiver event %+v", ev)
	}
	if s := a.dev.Query(); s.MaxQP == 0 {
		t.Fatal("query")
	}
	a.waitEvent(EventTerminateReceived)
}

// TestReadFence: a Send with the Read fence leaves only after the earlier
// Read completed, so when the peer sees the Send the Read's completion is
// already on the requester's CQ.
func TestReadFence(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		for i := uint64(0); i < 16; i++ {
			b.postRecv(i, bRecv, 64)
		}
	})
	src, _ := b.reg(1<<20, LocalRead|RemoteRead)
	sink, _ := a.reg(1<<20, LocalWrite|RemoteWrite)
	for round := uint64(0); round < 8; round++ {
		a.post(SendWR{ID: 10 * round, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 1 << 20}, Remote: RemoteAddr{STag: src.STag()}})
		a.post(SendWR{ID: 10*round + 1, Op: WRSend, ReadFence: true})
		b.waitOK(b.rcq, WRRecv)
		wcs := drainCQ(a.scq)
		if len(wcs) == 0 || wcs[0].ID != 10*round || wcs[0].Op != WRRead || wcs[0].Status != StatusSuccess {
			t.Fatalf("round %d: the fenced Send arrived before the Read completed (%+v)", round, wcs)
		}
		if len(wcs) == 1 {
			a.waitOK(a.scq, WRSend)
		}
	}
}

// TestConcurrentAtomics: four QPs on one device hammer one word of another
// device with Fetch-and-Add and with Compare-and-Swap increments. Every
// Fetch-and-Add returns a distinct old value, and the final counts are
// exact (atomicity across QPs of the responder, RFC 7306 §5).
func TestConcurrentAtomics(t *testing.T) {
	const qps, adds, swaps = 4, 200, 40
	cfg := DefaultConfig()
	cfg.Logger = testLogger()
	ini, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ini.Close()
	cfg.Name = "responder"
	resp, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	rpd, _ := resp.AllocPD()
	word := make([]byte, 16)
	wmr, err := rpd.RegisterBytes(word, LocalRead|LocalWrite|RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := resp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		for i := 0; i < qps; i++ {
			req, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			cq, _ := resp.CreateCQ(16, 0)
			qp, err := rpd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SQDepth: 4, RQDepth: 4, MaxSendSGE: 1, MaxRecvSGE: 1,
				IRD: 16, ORD: 1, InboundAtomic: true})
			if err != nil {
				req.Reject(nil)
				return
			}
			req.Accept(ctx, qp, AcceptParams{})
		}
	}()
	ipd, _ := ini.AllocPD()
	var wg sync.WaitGroup
	olds := make([][]uint64, qps)
	errs := make(chan error, qps)
	for q := 0; q < qps; q++ {
		cq, _ := ini.CreateCQ(512, 0)
		qp, err := ipd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SQDepth: 256, RQDepth: 4, MaxSendSGE: 1, MaxRecvSGE: 1, IRD: 1, ORD: 8})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ini.Connect(ctx, qp, ln.Addr().String(), ConnParams{}); err != nil {
			t.Fatal(err)
		}
		res := make([]byte, 8*adds)
		rmr, _ := ipd.RegisterBytes(res, LocalWrite)
		one := make([]byte, 8)
		omr, _ := ipd.RegisterBytes(one, LocalWrite)
		wg.Add(1)
		go func(q int) {
			defer wg.Done()
			wcs := make([]WC, 64)
			wait := func(n int) error {
				for got := 0; got < n; {
					m, err := cq.Wait(ctx, wcs[:min(len(wcs), n-got)])
					if err != nil {
						return err
					}
					for _, wc := range wcs[:m] {
						if wc.Status != StatusSuccess {
							return &CompletionError{WC: wc}
						}
					}
					got += m
				}
				return nil
			}
			// Fetch-and-Add on the word at offset 0, in batches of 100.
			for i := 0; i < adds; i += 100 {
				for j := i; j < i+100; j++ {
					if _, err := qp.PostSend(SendWR{ID: uint64(j), Op: WRFetchAdd, Local: SGE{STag: rmr.STag(), TO: uint64(8 * j), Len: 8},
						Remote: RemoteAddr{STag: wmr.STag(), TO: 0}, AddSwap: 1}); err != nil {
						errs <- err
						return
					}
				}
				if err := wait(100); err != nil {
					errs <- err
					return
				}
			}
			for j := 0; j < adds; j++ {
				olds[q] = append(olds[q], binary.NativeEndian.Uint64(res[8*j:]))
			}
			// Compare-and-Swap increments of the word at offset 8: read the
			// value with a Fetch-and-Add of 0, then try to swap in +1.
			cur := uint64(0)
			for done := 0; done < swaps; {
				qp.PostSend(SendWR{ID: 1, Op: WRCmpSwap, Local: SGE{STag: omr.STag(), Len: 8}, Remote: RemoteAddr{STag: wmr.STag(), TO: 8},
					Compare: cur, CompareMask: ^uint64(0), AddSwap: cur + 1, AddSwapMask: ^uint64(0)})
				if err := wait(1); err != nil {
					errs <- err
					return
				}
				old := binary.NativeEndian.Uint64(one)
				if old == cur {
					done++
					cur++
				} else {
					cur = old
				}
			}
		}(q)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []uint64
	for _, o := range olds {
		all = append(all, o...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for i, v := range all {
		if v != uint64(i) {
			t.Fatalf("fetch-add old values are not 0..%d: position %d holds %d", qps*adds-1, i, v)
		}
	}
	if got := binary.NativeEndian.Uint64(word); got != qps*adds {
		t.Fatalf("counter %d, want %d", got, qps*adds)
	}
	if got := binary.NativeEndian.Uint64(word[8:]); got != qps*swaps {
		t.Fatalf("CAS counter %d, want %d", got, qps*swaps)
	}
}
