package rnic

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rnic-dev/rnic/rnic/term"
)

// TestBindRightsMatrix checks every row of the draft's Figure 20 (a
// window's remote rights against its region's local rights) and Figure 19
// (a window's TO base against its region's), by executing Bind MW directly
// on an unconnected QP. A refused Bind leaves the window invalid.
func TestBindRightsMatrix(t *testing.T) {
	d, err := Open(Config{Name: "bind", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(16, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, BindMW: true})
	if err != nil {
		t.Fatal(err)
	}
	const va = 0x40_0000
	region := func(local Access, zeroBased bool) *MR {
		t.Helper()
		o := MROptions{Access: local | MWBind, ZeroBased: zeroBased}
		if !zeroBased {
			o.VA = va
		}
		mr, err := pd.RegisterMR(Bytes(make([]byte, 8192)), o)
		if err != nil {
			t.Fatalf("register %s: %v", local, err)
		}
		return mr
	}
	bind := func(mr *MR, zeroBased bool, remote Access) (Status, *MW) {
		t.Helper()
		mw, err := pd.AllocMW()
		if err != nil {
			t.Fatal(err)
		}
		base := uint64(va)
		if info, _ := mr.Query(); info.ZeroBased {
			base = 0
		}
		st := d.bindMW(qp, &BindMW{MW: mw.STag().WithKey(0x77), MR: mr.STag(), ZeroBased: zeroBased,
			VA: base + 1024, Len: 2048, Access: remote})
		info, err := mw.Query()
		if err != nil {
			t.Fatal(err)
		}
		if info.Valid != (st == StatusSuccess) {
			t.Fatalf("bind status %s but window valid=%v", st, info.Valid)
		}
		if st == StatusSuccess && (info.Access != remote || info.ZeroBased != zeroBased || info.Len != 2048 || info.STag.Key() != 0x77) {
			t.Fatalf("bound window %+v, asked %s zero-based=%v", info, remote, zeroBased)
		}
		return st, mw
	}

	// Figure 20. Row "None / Any": a region needs a local right to exist
	// (C11.3), so a Bind can never find one without; "Any / None" is an
	// empty set requested.
	if _, err := pd.RegisterMR(Bytes(make([]byte, 64)), MROptions{Access: MWBind, VA: va}); !errors.Is(err, ErrInvalidAccess) {
		t.Fatalf("region with no local right: %v", err)
	}
	rows := 1
	locals := []Access{LocalRead, LocalWrite, LocalRead | LocalWrite}
	remotes := []Access{RemoteWrite, RemoteRead, RemoteRead | RemoteWrite, 0}
	allowed := map[[2]Access]bool{
		{LocalRead, RemoteRead}:                            true,
		{LocalWrite, RemoteWrite}:                          true,
		{LocalRead | LocalWrite, RemoteWrite}:              true,
		{LocalRead | LocalWrite, RemoteRead}:               true,
		{LocalRead | LocalWrite, RemoteRead | RemoteWrite}: true,
	}
	for _, l := range locals {
		mr := region(l, false)
		for _, r := range remotes {
			name := fmt.Sprintf("region %q window %q", l.String(), r.String())
			st, _ := bind(mr, false, r)
			want := StatusAccessViolation
			if allowed[[2]Access{l, r}] {
				want = StatusSuccess
			}
			if st != want {
				t.Errorf("Figure 20, %s: bind %s, want %s", name, st, want)
			}
			rows++
		}
	}
	// Remote Atomic needs what Remote Write needs (it writes).
	if st, _ := bind(region(LocalRead, false), false, RemoteAtomic); st != StatusAccessViolation {
		t.Errorf("atomic window on a region without Local Write: %s", st)
	}
	if st, _ := bind(region(LocalWrite, false), false, RemoteAtomic); st != StatusSuccess {
		t.Errorf("atomic window on a region with Local Write: %s", st)
	}
	// A region without the Bind right refuses every window.
	plain, err := pd.RegisterMR(Bytes(make([]byte, 8192)), MROptions{Access: LocalRead | LocalWrite, VA: va})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := bind(plain, false, RemoteRead); st != StatusAccessViolation {
		t.Errorf("window on a region without MW Bind: %s", st)
	}

	// Figure 19: a zero-based region takes no window (either kind); a
	// VA-based region takes both.
	for _, c := range []struct {
		mrZero, mwZero, ok bool
	}{{true, true, false}, {true, false, false}, {false, true, true}, {false, false, true}} {
		st, _ := bind(region(LocalRead|LocalWrite, c.mrZero), c.mwZero, RemoteRead|RemoteWrite)
		want := StatusInvalidRegion
		if c.ok {
			want = StatusSuccess
		}
		if st != want {
			t.Errorf("Figure 19, region zero-based=%v window zero-based=%v: bind %s, want %s", c.mrZero, c.mwZero, st, want)
		}
		rows++
	}
	t.Logf("%d rows of Figures 19 and 20 checked", rows)
}

// TestBindRefusedOverTheWire: a Bind that Figure 20 refuses, posted on a
// connected QP, completes in error, the WR after it is flushed, the QP
// goes to Error with a Terminate to the peer, and the window stays invalid
// (draft §7.10.2: "If the RNIC detects an error with the Bind operation,
// it MUST put the QP into the Error state").
func TestBindRefusedOverTheWire(t *testing.T) {
	a, b := newPair(t, pairOpts{}, nil)
	mr, err := b.pd.RegisterMR(Bytes(make([]byte, 4096)), MROptions{Access: LocalRead | MWBind, VA: 0x9000})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := b.reg(16, LocalRead)
	if n, err := b.qp.PostSend(
		SendWR{ID: 1, Op: WRBindMW, Bind: &BindMW{MW: mw.STag().WithKey(9), MR: mr.STag(), VA: 0x9000, Len: 4096, Access: RemoteWrite}},
		SendWR{ID: 2, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 16}}}); n != 2 || err != nil {
		t.Fatalf("posted %d: %v", n, err)
	}
	for _, want := range []struct {
		id uint64
		st Status
	}{{1, StatusAccessViolation}, {2, StatusFlushed}} {
		if wc := b.wait(b.scq); wc.ID != want.id || wc.Status != want.st {
			t.Fatalf("completion %+v, want id %d %s", wc, want.id, want.st)
		}
	}
	b.waitState(StateError)
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}
	if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Cause != want {
		t.Fatalf("peer event %+v", ev)
	}
	a.waitState(StateError)
	if info, err := mw.Query(); err != nil || info.Valid {
		t.Fatalf("window after a refused bind: %+v %v", info, err)
	}
	if info, _ := mr.Query(); info.BoundMWs != 0 {
		t.Fatalf("region counts %d bound windows after a refused bind", info.BoundMWs)
	}
}
