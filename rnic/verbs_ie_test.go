package rnic

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Verb-level immediate errors and resource rules (draft §8.3.1: an IE
// leaves its subject unchanged), and a few work requests whose failure
// statuses rnic/CHECKLIST.md points to.

// TestResourceDependencies: a PD, CQ, S-RQ, region or QP in use cannot be
// freed (draft §5.1.1.2, §5.2.2, §5.3.4, §6.1.4, §6.3.3, §7.9); freed in
// the right order, everything goes; Close frees the rest.
func TestResourceDependencies(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	_ = a
	d := b.dev
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(8, 0)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := d.CreateSRQ(pd, 8, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegisterBytes(make([]byte, 64), LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qp.PostRecv(RecvWR{ID: 1}); !errors.Is(err, ErrRQHasSRQ) {
		t.Fatalf("PostRecv on a QP with an S-RQ: %v", err)
	}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"PD", pd.Dealloc(), ErrPDInUse},
		{"CQ", cq.Destroy(), ErrCQInUse},
		{"S-RQ", srq.Destroy(), ErrSRQInUse},
	} {
		if !errors.Is(c.err, c.want) {
			t.Fatalf("%s in use: %v, want %v", c.name, c.err, c.want)
		}
	}
	// A window bound to the connected QP b.qp pins that QP and its region.
	bmr, err := b.pd.RegisterMR(Bytes(make([]byte, 4096)), MROptions{Access: LocalRead | LocalWrite | MWBind, VA: 0x1000})
	if err != nil {
		t.Fatal(err)
	}
	bmw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	b.post(SendWR{ID: 1, Op: WRBindMW, Bind: &BindMW{MW: bmw.STag().WithKey(3), MR: bmr.STag(), VA: 0x1000, Len: 64, Access: RemoteRead}})
	b.waitOK(b.scq, WRBindMW)
	if err := b.qp.Destroy(); !errors.Is(err, ErrMWBoundToQP) {
		t.Fatalf("destroy QP with a bound window: %v", err)
	}
	if err := bmr.Dealloc(); !errors.Is(err, ErrMWBound) {
		t.Fatalf("dealloc region with a bound window: %v", err)
	}
	if err := bmr.Reregister(b.pd, Bytes(make([]byte, 64)), MROptions{Access: LocalWrite}); !errors.Is(err, ErrMWBound) {
		t.Fatalf("reregister region with a bound window: %v", err)
	}
	if err := bmw.Dealloc(); err != nil { // deallocating a bound window unbinds it
		t.Fatal(err)
	}
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := bmr.Dealloc(); err != nil {
		t.Fatal(err)
	}
	// Teardown order: QP, S-RQ, CQ, region, window, PD.
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := cq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrPDInUse) {
		t.Fatalf("PD with a region and a window: %v", err)
	}
	if err := mr.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := mw.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrInvalidPD) {
		t.Fatalf("second dealloc: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateCQ(1, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("create CQ after Close: %v", err)
	}
	if _, err := d.AllocPD(); err == nil {
		t.Fatal("allocate PD after Close")
	}
}

// TestCreateQPDefaultsAndLimits: Create QP fills in the sizes left zero and
// refuses attributes beyond the device's limits with the matching error,
// creating nothing (draft §6.1.1).
func TestCreateQPDefaultsAndLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Logger = testLogger()
	cfg.MaxSGE, cfg.MaxWriteSGE, cfg.MaxWR = 2, 8, 256
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd, _ := d.AllocPD()
	cq, err := d.CreateCQ(16, 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := Open(Config{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	opd, _ := other.AllocPD()
	foreign, err := other.CreateSRQ(opd, 8, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	got := qp.Query().Config
	if got.SQDepth != 128 || got.RQDepth != 128 || got.MaxSendSGE != 2 || got.MaxWriteSGE != 4 || got.MaxRecvSGE != 2 {
		t.Fatalf("defaults: SQ %d RQ %d SGEs send %d write %d recv %d, want 128 128 2 4 2",
			got.SQDepth, got.RQDepth, got.MaxSendSGE, got.MaxWriteSGE, got.MaxRecvSGE)
	}
	base := QPConfig{SendCQ: cq, RecvCQ: cq}
	for _, c := range []struct {
		name string
		mod  func(*QPConfig)
		want error
	}{
		{"no send CQ", func(c *QPConfig) { c.SendCQ = nil }, ErrInvalidCQ},
		{"SQ depth", func(c *QPConfig) { c.SQDepth = 257 }, ErrWRExceedsCapability},
		{"RQ depth", func(c *QPConfig) { c.RQDepth = 257 }, ErrWRExceedsCapability},
		{"send SGEs", func(c *QPConfig) { c.MaxSendSGE = 3 }, ErrSGEExceedsCapability},
		{"write SGEs", func(c *QPConfig) { c.MaxWriteSGE = 9 }, ErrSGEExceedsCapability},
		{"receive SGEs", func(c *QPConfig) { c.MaxRecvSGE = 3 }, ErrSGEExceedsCapability},
		{"IRD", func(c *QPConfig) { c.IRD = cfg.MaxIRD + 1 }, ErrIRDExceedsCapability},
		{"ORD", func(c *QPConfig) { c.ORD = -1 }, ErrORDExceedsCapability},
		{"RQ limit", func(c *QPConfig) { c.RQLimit = -1 }, ErrRQLimit},
		{"S-RQ of another device", func(c *QPConfig) { c.SRQ = foreign }, ErrInvalidSRQ},
	} {
		qc := base
		c.mod(&qc)
		if qp, err := pd.CreateQP(qc); !errors.Is(err, c.want) || qp != nil {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// The refusals created nothing: the CQ is used by the one QP only.
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := cq.Destroy(); err != nil {
		t.Fatalf("destroying the CQ after the refused QPs: %v", err)
	}
}

// TestPostImmediateErrors: PostSQ/PostRQ immediate errors (draft Fig. 34);
// a list stops at the first bad WR, the ones before it are queued.
func TestPostImmediateErrors(t *testing.T) {
	_, _, cq, qp, mr, _ := idleQP(t, 64, 4)
	sge := SGE{STag: mr.STag(), Len: 8}
	for _, c := range []struct {
		name string
		wr   SendWR
		want error
	}{
		{"bad op", SendWR{Op: 99}, ErrInvalidOp},
		{"too many SGEs", SendWR{Op: WRSend, SGL: []SGE{sge, sge, sge, sge, sge}}, ErrInvalidSGLLength},
		{"write with too many SGEs", SendWR{Op: WRWrite, SGL: []SGE{sge, sge, sge, sge, sge}}, ErrInvalidSGLLength},
		{"read with an SGL", SendWR{Op: WRRead, SGL: []SGE{sge}}, ErrInvalidSGLFormat},
		{"atomic result not 8 bytes", SendWR{Op: WRFetchAdd, Local: SGE{STag: mr.STag(), Len: 4}}, ErrInvalidSGLFormat},
		{"immediate with an SGL", SendWR{Op: WRImmediate, SGL: []SGE{sge}}, ErrInvalidSGLFormat},
		{"bind without Bind", SendWR{Op: WRBindMW}, ErrInvalidModifier},
		{"message over 4 GiB", SendWR{Op: WRSend, SGL: []SGE{{Len: 1<<32 - 1}, {Len: 1}}}, ErrInvalidSGLLength},
	} {
		if n, err := qp.PostSend(SendWR{ID: 1, Op: WRSend}, c.wr, SendWR{ID: 3, Op: WRSend}); n != 1 || !errors.Is(err, c.want) {
			t.Fatalf("%s: posted %d, %v; want 1 and %v", c.name, n, err, c.want)
		}
		if err := qp.Modify(StateError, ModifyAttrs{}); err != nil {
			t.Fatal(err)
		}
		if wcs := drainCQ(cq); len(wcs) != 1 || wcs[0].ID != 1 {
			t.Fatalf("%s: flushed %+v", c.name, wcs)
		}
		qp.Modify(StateIdle, ModifyAttrs{})
	}
	if n, err := qp.PostRecv(RecvWR{ID: 1}, RecvWR{ID: 2, SGL: []SGE{sge, sge, sge, sge, sge}}); n != 1 || !errors.Is(err, ErrInvalidSGLLength) {
		t.Fatalf("receive with too many SGEs: %d %v", n, err)
	}
	for i := 0; i < 3; i++ {
		qp.PostRecv(RecvWR{ID: 10})
	}
	if _, err := qp.PostRecv(RecvWR{ID: 11}); !errors.Is(err, ErrTooManyWRs) {
		t.Fatalf("RQ overflow: %v", err)
	}
	for i := 0; i < 4; i++ {
		qp.PostSend(SendWR{ID: 20, Op: WRSend})
	}
	if _, err := qp.PostSend(SendWR{ID: 21, Op: WRSend}); !errors.Is(err, ErrTooManyWRs) {
		t.Fatalf("SQ overflow: %v", err)
	}
	// Resizing with WRs outstanding; below what is outstanding is refused.
	if err := qp.Modify(StateIdle, ModifyAttrs{SQDepth: 2}); !errors.Is(err, ErrShrink) {
		t.Fatalf("SQ shrink below outstanding: %v", err)
	}
	if err := qp.Modify(StateIdle, ModifyAttrs{SQDepth: 16, RQDepth: 16}); err != nil {
		t.Fatal(err)
	}
	if q := qp.Query(); q.Config.SQDepth != 16 || q.Config.RQDepth != 16 || q.State != StateIdle {
		t.Fatalf("after resize %+v", q)
	}
	if _, err := qp.PostSend(SendWR{ID: 22, Op: WRSend}); err != nil {
		t.Fatalf("post after growing: %v", err)
	}
	if err := qp.Modify(StateError, ModifyAttrs{SQDepth: 32}); !errors.Is(err, ErrCannotChangeAttribute) {
		t.Fatalf("attributes on Idle->Error: %v", err)
	}
	if err := qp.Modify(StateIdle, ModifyAttrs{IRD: 1 << 20}); !errors.Is(err, ErrIRDExceedsCapability) {
		t.Fatalf("IRD beyond capability: %v", err)
	}
	if err := qp.Modify(StateIdle, ModifyAttrs{ArmRQLimit: true, RQLimit: 1}); !errors.Is(err, ErrRQLimit) {
		t.Fatalf("RQ limit without an S-RQ: %v", err)
	}
	if q := qp.Query(); q.Config.SQDepth != 16 || q.State != StateIdle {
		t.Fatalf("QP changed by refused Modifies: %+v", q)
	}
	if err := qp.Modify(StateError, ModifyAttrs{}); err != nil {
		t.Fatal(err)
	}
	if n := len(drainCQ(cq)); n != 5+4 { // 5 sends, 4 receives
		t.Fatalf("%d flushed", n)
	}
}

// TestZeroORD: an RDMA Read on a QP whose ORD is 0 completes with Zero RDMA
// Read Resources and terminates the stream (RDMAP Local Catastrophic).
func TestZeroORD(t *testing.T) {
	a, b := newPair(t, pairOpts{qp: QPConfig{ORD: -1, InboundRead: true, InboundWrite: true}}, nil)
	if q := a.qp.Query(); q.ORD != 0 {
		t.Fatalf("ORD %d", q.ORD)
	}
	sink, _ := a.reg(64, LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 8}, Remote: RemoteAddr{STag: 0x100}})
	if wc := a.wait(a.scq); wc.Status != StatusZeroORD {
		t.Fatalf("%+v", wc)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}
	if ev := b.waitEvent(EventTerminateReceived); ev.Terminate.Cause != want {
		t.Fatalf("peer event %+v", ev)
	}
}

// TestFastRegisterNotPrivileged: Fast-Register on a QP not created
// Privileged completes with QP Not In Privileged Mode.
func TestFastRegisterNotPrivileged(t *testing.T) {
	a, _ := newPair(t, pairOpts{qp: QPConfig{InboundRead: true, InboundWrite: true}}, nil)
	mr, err := a.pd.AllocMRSTag(1, true)
	if err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 1, Op: WRFastReg, FastReg: &FastReg{STag: mr.STag().WithKey(1), Mem: Bytes(make([]byte, 64)), ZeroBased: true, Access: LocalRead}})
	if wc := a.wait(a.scq); wc.Status != StatusNotPrivileged {
		t.Fatalf("%+v", wc)
	}
	if info, _ := mr.Query(); info.Valid {
		t.Fatal("registered anyway")
	}
}

// TestReregisterAndShared: RI-Reregister (new memory, rights and key; same
// index; on a failure other than bound windows the region is gone) and
// Register Shared MR (the source key is checked, the source becomes Shared
// and cannot be invalidated).
func TestReregisterAndShared(t *testing.T) {
	_, pd, _, _, _, _ := idleQP(t, 4, 4)
	mr, err := pd.RegisterMR(Bytes(make([]byte, 64)), MROptions{Access: LocalWrite, Key: 1, FixedKey: true, ZeroBased: true})
	if err != nil {
		t.Fatal(err)
	}
	old := mr.STag()
	if err := mr.Reregister(pd, Bytes(make([]byte, 128)), MROptions{Access: LocalRead | RemoteRead, Key: 9, FixedKey: true, ZeroBased: true}); err != nil {
		t.Fatal(err)
	}
	info, _ := mr.Query()
	if info.STag != old.WithKey(9) || info.Len != 128 || info.Access != LocalRead|RemoteRead || !info.Valid {
		t.Fatalf("after reregister %+v", info)
	}
	sh, err := mr.RegisterShared(old, pd, MROptions{Access: LocalRead, ZeroBased: true})
	if !errors.Is(err, ErrInvalidSTag) || sh != nil {
		t.Fatalf("register shared with the old key: %v", err)
	}
	if sh, err = mr.RegisterShared(mr.STag(), pd, MROptions{Access: LocalRead, ZeroBased: true}); err != nil {
		t.Fatal(err)
	}
	if si, _ := sh.Query(); si.STag.Index() == old.Index() || !si.Shared || si.Len != 128 {
		t.Fatalf("shared region %+v", si)
	}
	if info, _ := mr.Query(); !info.Shared {
		t.Fatal("source not Shared")
	}
	if err := mr.Invalidate(); !errors.Is(err, ErrInvalidSTag) {
		t.Fatalf("invalidate a shared region: %v", err)
	}
	// A failed reregistration (bad rights) deallocates the region.
	other, _ := pd.RegisterBytes(make([]byte, 64), LocalWrite)
	if err := other.Reregister(pd, Bytes(make([]byte, 64)), MROptions{Access: RemoteWrite}); !errors.Is(err, ErrInvalidAccess) {
		t.Fatalf("reregister with bad rights: %v", err)
	}
	if _, err := other.Query(); err == nil {
		t.Fatal("region survived a failed reregistration")
	}
}

// TestPageListRegion: page-list mode (draft §7.6.2): a VA-based region over
// four 4 KiB pages with a first byte offset; a remote Write across page
// boundaries lands in the right pages; shape errors are refused.
func TestPageListRegion(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	pages := make([][]byte, 4)
	for i := range pages {
		pages[i] = make([]byte, 4096)
	}
	const fbo, va = 100, 0x10000 + 100
	mr, err := b.pd.RegisterMR(Memory{Pages: pages, PageSize: 4096, FBO: fbo, Len: 4*4096 - fbo}, MROptions{Access: LocalWrite | RemoteWrite, VA: va})
	if err != nil {
		t.Fatal(err)
	}
	src, srcBuf := a.reg(9000, LocalRead)
	fill(srcBuf, 41)
	a.post(SendWR{ID: 1, Op: WRWrite, SGL: []SGE{{STag: src.STag(), Len: 9000}}, Remote: RemoteAddr{STag: mr.STag(), TO: va + 4000}})
	a.waitOK(a.scq, WRWrite)
	b2, _ := b.reg(8, LocalWrite)
	b.postRecv(1, b2, 8)
	a.post(SendWR{ID: 2, Op: WRSend}) // the Write's data is visible once this arrives
	b.waitOK(b.rcq, WRRecv)
	var flat []byte
	for _, p := range pages {
		flat = append(flat, p...)
	}
	if !bytes.Equal(flat[fbo+4000:fbo+4000+9000], srcBuf) {
		t.Fatal("data across pages differs")
	}
	for _, c := range []struct {
		name string
		m    Memory
		o    MROptions
		want error
	}{
		{"VA mod page size != FBO", Memory{Pages: pages, PageSize: 4096, FBO: fbo, Len: 100}, MROptions{Access: LocalWrite, VA: 0x10000}, ErrInvalidVA},
		{"page size not a power of two", Memory{Pages: pages, PageSize: 3000, Len: 100}, MROptions{Access: LocalWrite, ZeroBased: true}, ErrInvalidBufferSize},
		{"FBO >= page size", Memory{Pages: pages, PageSize: 4096, FBO: 4096, Len: 100}, MROptions{Access: LocalWrite, ZeroBased: true}, ErrInvalidFBO},
		{"length beyond the pages", Memory{Pages: pages, PageSize: 4096, Len: 4*4096 + 1}, MROptions{Access: LocalWrite, ZeroBased: true}, ErrInvalidLength},
		{"no local right", Memory{Pages: pages, PageSize: 4096, Len: 100}, MROptions{Access: RemoteRead, ZeroBased: true}, ErrInvalidAccess},
	} {
		if _, err := b.pd.RegisterMR(c.m, c.o); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// TestSharedVAWrap: Register Shared MR at a VA from which the region's end
// would wrap past 2^64 is refused with ErrInvalidVA, as a region of its
// own is; ending on the last address is fine.
func TestSharedVAWrap(t *testing.T) {
	_, pd, _, _, _, _ := idleQP(t, 4, 4)
	src, err := pd.RegisterMR(Bytes(make([]byte, 128)), MROptions{Access: LocalRead, VA: 0x1000})
	if err != nil {
		t.Fatal(err)
	}
	if sh, err := src.RegisterShared(src.STag(), pd, MROptions{Access: LocalRead, VA: math.MaxUint64 - 63}); !errors.Is(err, ErrInvalidVA) || sh != nil {
		t.Fatalf("shared at a VA that wraps: %v", err)
	}
	sh, err := src.RegisterShared(src.STag(), pd, MROptions{Access: LocalRead, VA: math.MaxUint64 - 127})
	if err != nil {
		t.Fatalf("shared ending on the last address: %v", err)
	}
	if si, _ := sh.Query(); si.Len != 128 {
		t.Fatalf("shared region %+v", si)
	}
}
