package rnic

import (
	"bytes"
	"testing"
)

// TestPlaced: MR.Placed counts the bytes inbound RDMA Writes placed from
// the region's first byte without a gap: a multi-segment Write grows it to
// the Write's end, a Write past a gap leaves it, the Write that closes the
// gap grows it only to its own end (the bytes past the gap are not
// claimed), an Invalidate keeps it readable, a Fast-Register starts it
// again at 0, and Writes through a window count for the window's region at
// the window's offset in it.
func TestPlaced(t *testing.T) {
	const n = 200 << 10 // several FPDUs
	a, b := newPair(t, pairOpts{}, nil)
	src, srcBuf := a.reg(n, LocalRead)
	fill(srcBuf, 7)
	ping, _ := b.reg(16, LocalWrite)
	pingSrc, _ := a.reg(16, LocalRead)
	// placedNow returns mr.Placed once b has placed everything a sent
	// before: a Send behind the Writes completes at b only after them.
	placedNow := func(mr *MR) uint64 {
		t.Helper()
		b.postRecv(9, ping, 16)
		a.post(SendWR{ID: 9, Op: WRSend, SGL: []SGE{{STag: pingSrc.STag(), Len: 16}}})
		a.waitOK(a.scq, WRSend)
		b.waitOK(b.rcq, WRRecv)
		return mr.Placed()
	}
	write := func(dst STag, to uint64, srcOff uint64, length int) {
		t.Helper()
		a.post(SendWR{ID: 2, Op: WRWrite, SGL: []SGE{{STag: src.STag(), TO: srcOff, Len: uint32(length)}},
			Remote: RemoteAddr{STag: dst, TO: to}})
		a.waitOK(a.scq, WRWrite)
	}
	want := func(mr *MR, what string, v uint64) {
		t.Helper()
		if got := placedNow(mr); got != v {
			t.Fatalf("%s: Placed %d, want %d", what, got, v)
		}
	}

	mr, err := b.pd.AllocMRSTag(1, true)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	key := uint8(0x30)
	fastReg := func() STag {
		t.Helper()
		key++
		st := mr.STag().WithKey(key)
		b.post(SendWR{ID: 1, Op: WRFastReg, FastReg: &FastReg{STag: st, Mem: Bytes(buf), ZeroBased: true,
			Access: LocalWrite | RemoteWrite}})
		b.waitOK(b.scq, WRFastReg)
		return st
	}
	st := fastReg()
	want(mr, "after Fast-Register", 0)
	write(st, 0, 0, 100<<10)
	want(mr, "one Write from the start", 100<<10)
	write(st, 150<<10, 150<<10, 10<<10)
	want(mr, "a Write past a gap", 100<<10)
	write(st, 90<<10, 90<<10, 40<<10) // overlaps the prefix, stops short of 150 KiB
	want(mr, "a Write overlapping the prefix's end", 130<<10)
	write(st, 130<<10, 130<<10, n-130<<10)
	want(mr, "the rest", n)
	if !bytes.Equal(buf, srcBuf) {
		t.Fatal("the region does not hold the Writes' bytes")
	}
	b.post(SendWR{ID: 3, Op: WRInvalidate, InvalidateSTag: st})
	b.waitOK(b.scq, WRInvalidate)
	want(mr, "after Invalidate", n)
	fastReg()
	want(mr, "after the next Fast-Register", 0)

	// A window over the second half of a VA-based region: the window's
	// first byte is the region's byte n/2, so the region's prefix grows
	// through the window only once the first half is placed.
	const va = 0x100000
	vmr, err := b.pd.RegisterMR(Bytes(make([]byte, n)), MROptions{Access: LocalWrite | RemoteWrite | MWBind, VA: va})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	wst := mw.STag().WithKey(9)
	b.post(SendWR{ID: 4, Op: WRBindMW, Bind: &BindMW{MW: wst, MR: vmr.STag(), VA: va + n/2, Len: n / 2, ZeroBased: true,
		Access: RemoteWrite}})
	b.waitOK(b.scq, WRBindMW)
	write(wst, 0, 0, n/2)
	want(vmr, "a Write through the window, past a gap of the region", 0)
	write(vmr.STag(), va, 0, n/2)
	want(vmr, "the region's first half", n/2)
	write(wst, 0, 0, 1)
	want(vmr, "a Write through the window at the prefix's end", n/2+1)
}
