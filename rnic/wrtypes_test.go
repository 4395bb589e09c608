package rnic

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// Work request types and options between two engines that
// TestEveryOperation does not cover: Send with SE and Invalidate, plain
// Immediate Data, the local fence, RDMA Read with Invalidate, multi-SGE
// scatter/gather lists on both sides, and masked atomics.

// notified reports whether cq's notification fired within d (0: whether it
// has fired).
func notified(cq *CQ, d time.Duration) bool {
	if d == 0 {
		select {
		case <-cq.C():
			return true
		default:
			return false
		}
	}
	select {
	case <-cq.C():
		return true
	case <-time.After(d):
		return false
	}
}

// TestSendSEInvalidate: Send with Solicited Event and Invalidate. The
// receive completes solicited (a solicited-only arm fires) and names the
// STag, which the receiver's RNIC invalidated before the completion.
func TestSendSEInvalidate(t *testing.T) {
	for _, v := range variants[:4] {
		t.Run(v.name, func(t *testing.T) {
			var bRecv *MR
			var bRecvBuf []byte
			a, b := newPair(t, v.o, func(a, b *side) {
				bRecv, bRecvBuf = b.reg(64, LocalWrite)
				b.postRecv(1, bRecv, 64)
			})
			target, _ := b.reg(4096, LocalWrite|RemoteWrite|RemoteRead|LocalRead)
			msg, msgBuf := a.reg(64, LocalRead)
			fill(msgBuf, 11)
			if err := b.rcq.RequestNotify(true); err != nil {
				t.Fatal(err)
			}
			a.post(SendWR{ID: 1, Op: WRSendSEInv, SGL: []SGE{{STag: msg.STag(), Len: 40}}, InvalidateSTag: target.STag()})
			a.waitOK(a.scq, WRSendSEInv)
			if !notified(b.rcq, 10*time.Second) {
				t.Fatal("no solicited notification")
			}
			wc := b.waitOK(b.rcq, WRRecv)
			if !wc.Solicited || !wc.HasInvalidated || wc.Invalidated != target.STag() || wc.Bytes != 40 || wc.HasImm {
				t.Fatalf("receive %+v", wc)
			}
			if !bytes.Equal(bRecvBuf[:40], msgBuf[:40]) {
				t.Fatal("payload differs")
			}
			if info, _ := target.Query(); info.Valid {
				t.Fatal("STag still valid after Send with SE and Invalidate")
			}
		})
	}
}

// TestImmediatePlain: Immediate Data without SE consumes a receive,
// completes with the 8 bytes and zero length, and is not solicited: a
// solicited-only arm stays quiet, a "next" arm fires.
func TestImmediatePlain(t *testing.T) {
	var bRecv *MR
	var bRecvBuf []byte
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, bRecvBuf = b.reg(64, LocalWrite)
		b.postRecv(1, bRecv, 64)
		b.postRecv(2, bRecv, 64)
	})
	if err := b.rcq.RequestNotify(true); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 1, Op: WRImmediate, Imm: 0x0123456789ABCDEF})
	a.waitOK(a.scq, WRImmediate)
	a.roundTrip() // b has handled the Immediate Data, notification included
	if b.rcq.Len() != 1 {
		t.Fatalf("%d receive completions", b.rcq.Len())
	}
	if notified(b.rcq, 0) {
		t.Fatal("solicited-only notification fired for Immediate Data without SE")
	}
	wc := b.waitOK(b.rcq, WRRecv)
	if wc.ID != 1 || !wc.HasImm || wc.Imm != 0x0123456789ABCDEF || wc.Solicited || wc.Bytes != 0 || wc.HasInvalidated {
		t.Fatalf("receive %+v", wc)
	}
	for i, c := range bRecvBuf {
		if c != 0 {
			t.Fatalf("Immediate Data placed a byte in the receive buffer at %d", i)
		}
	}
	if err := b.rcq.RequestNotify(false); err != nil {
		t.Fatal(err)
	}
	a.post(SendWR{ID: 2, Op: WRImmediate, Imm: 7})
	if !notified(b.rcq, 10*time.Second) {
		t.Fatal("no next-completion notification")
	}
	if wc := b.waitOK(b.rcq, WRRecv); wc.ID != 2 || wc.Imm != 7 {
		t.Fatalf("second receive %+v", wc)
	}
}

// TestLocalFence: a WR with the local fence waits until every earlier WR
// completed. An Invalidate of an RDMA Read's sink posted right after the
// Read: fenced, it runs after the Read completed (both succeed, the data
// arrived, the sink is then invalid); unfenced, it runs at once and the
// Read Response finds an invalid sink (the Read fails).
func TestLocalFence(t *testing.T) {
	const n = 4 << 20
	t.Run("fenced", func(t *testing.T) {
		a, b := newPair(t, pairOpts{}, nil)
		src, srcBuf := b.reg(n, LocalRead|RemoteRead)
		fill(srcBuf, 12)
		sink, sinkBuf := a.reg(n, LocalWrite|RemoteWrite)
		a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: n}, Remote: RemoteAddr{STag: src.STag()}})
		a.post(SendWR{ID: 2, Op: WRInvalidate, InvalidateSTag: sink.STag(), LocalFence: true})
		if wc := a.waitOK(a.scq, WRRead); wc.ID != 1 {
			t.Fatalf("%+v", wc)
		}
		a.waitOK(a.scq, WRInvalidate)
		if !bytes.Equal(sinkBuf, srcBuf) {
			t.Fatal("read data differs")
		}
		if info, _ := sink.Query(); info.Valid {
			t.Fatal("sink valid after the fenced Invalidate")
		}
	})
	t.Run("unfenced", func(t *testing.T) {
		a, b := newPair(t, pairOpts{}, nil)
		src, _ := b.reg(n, LocalRead|RemoteRead)
		sink, _ := a.reg(n, LocalWrite|RemoteWrite)
		// One list: the transmitter takes both before it writes the Read
		// Request, so the Invalidate runs before any response can arrive
		// (two posts let a slow poster see the 4 MiB Read finish first).
		if k, err := a.qp.PostSend(
			SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: n}, Remote: RemoteAddr{STag: src.STag()}},
			SendWR{ID: 2, Op: WRInvalidate, InvalidateSTag: sink.STag()}); k != 2 || err != nil {
			t.Fatalf("posted %d: %v", k, err)
		}
		if wc := a.wait(a.scq); wc.ID != 1 || wc.Status == StatusSuccess {
			t.Fatalf("the Read succeeded although its sink was invalidated first: %+v", wc)
		}
		a.waitEvent(EventInvalidSTag)
		a.waitState(StateError)
		b.waitState(StateError)
	})
}

// TestReadWithInvalidate: RDMA Read with Invalidate Local STag invalidates
// the Read's data sink (Local.STag; draft §8.1.2.3, §8.2.2.1: after the
// response is placed, before the completion), not InvalidateSTag.
func TestReadWithInvalidate(t *testing.T) {
	const n = 300 << 10
	a, b := newPair(t, pairOpts{}, nil)
	src, srcBuf := b.reg(n, LocalRead|RemoteRead)
	fill(srcBuf, 13)
	sink, sinkBuf := a.reg(n, LocalWrite|RemoteWrite)
	other, _ := a.reg(64, LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 1, Op: WRReadInv, Local: SGE{STag: sink.STag(), Len: n}, Remote: RemoteAddr{STag: src.STag()},
		InvalidateSTag: other.STag()}) // ignored
	a.waitOK(a.scq, WRReadInv)
	if !bytes.Equal(sinkBuf, srcBuf) {
		t.Fatal("read data differs")
	}
	if info, _ := sink.Query(); info.Valid {
		t.Fatal("sink still valid after Read with Invalidate")
	}
	if info, _ := other.Query(); !info.Valid {
		t.Fatal("InvalidateSTag was invalidated: Read with Invalidate names its STag in Local")
	}
	// The sink is invalid now: a second Read into it fails on arrival.
	a.post(SendWR{ID: 2, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 16}, Remote: RemoteAddr{STag: src.STag()}})
	if wc := a.wait(a.scq); wc.ID != 2 || wc.Status == StatusSuccess {
		t.Fatalf("read into an invalidated sink: %+v", wc)
	}
}

// TestScatterGather: Send and RDMA Write gathering from several SGEs of
// several regions (at odd offsets, spanning FPDUs), and a receive
// scattering across several SGEs; bytes outside the SGEs stay untouched.
func TestScatterGather(t *testing.T) {
	for _, v := range []struct {
		name string
		o    pairOpts
	}{{"rev2-crc", pairOpts{}}, {"rev1-nocrc", pairOpts{rev: 1, noCRC: true}}, {"srq", pairOpts{srq: true}}} {
		t.Run(v.name, func(t *testing.T) {
			// Receive side: three regions, SGEs of 5, 70000 and 100000 bytes.
			var r1, r2, r3 *MR
			var r1b, r2b, r3b []byte
			rsgl := func() []SGE {
				return []SGE{{STag: r1.STag(), TO: 3, Len: 5}, {STag: r2.STag(), TO: 100, Len: 70000}, {STag: r3.STag(), TO: 1, Len: 100000}}
			}
			a, b := newPair(t, v.o, func(a, b *side) {
				r1, r1b = b.reg(16, LocalWrite)
				r2, r2b = b.reg(80000, LocalWrite)
				r3, r3b = b.reg(100002, LocalWrite)
				for id := uint64(1); id <= 3; id++ {
					wr := RecvWR{ID: id, SGL: rsgl()}
					var err error
					if s := b.qp.cfg.SRQ; s != nil {
						_, err = s.Post(wr)
					} else {
						_, err = b.qp.PostRecv(wr)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			})
			// Send side: three SGEs from two regions.
			s1, s1b := a.reg(200000, LocalRead)
			s2, s2b := a.reg(4096, LocalRead)
			fill(s1b, 21)
			fill(s2b, 22)
			ssgl := []SGE{{STag: s1.STag(), TO: 7, Len: 90001}, {STag: s2.STag(), TO: 9, Len: 3}, {STag: s1.STag(), TO: 100000, Len: 80000}}
			var want []byte
			for _, g := range ssgl {
				buf := s1b
				if g.STag == s2.STag() {
					buf = s2b
				}
				want = append(want, buf[g.TO:g.TO+uint64(g.Len)]...)
			}
			a.post(SendWR{ID: 1, Op: WRSend, SGL: ssgl})
			a.waitOK(a.scq, WRSend)
			wc := b.waitOK(b.rcq, WRRecv)
			if wc.ID != 1 || wc.Bytes != uint32(len(want)) {
				t.Fatalf("receive %+v, want %d bytes", wc, len(want))
			}
			var got []byte
			got = append(got, r1b[3:8]...)
			got = append(got, r2b[100:70100]...)
			got = append(got, r3b[1:1+len(want)-70005]...)
			if !bytes.Equal(got, want) {
				t.Fatal("scattered data differs")
			}
			zero := func(name string, b []byte) {
				for i, c := range b {
					if c != 0 {
						t.Fatalf("%s: byte %d outside the SGEs written", name, i)
					}
				}
			}
			zero("r1 head", r1b[:3])
			zero("r1 tail", r1b[8:])
			zero("r2 head", r2b[:100])
			zero("r2 tail", r2b[70100:])
			zero("r3 head", r3b[:1])
			zero("r3 tail", r3b[1+len(want)-70005:])

			// A short message fills only the first SGEs of the next receive.
			a.post(SendWR{ID: 2, Op: WRSend, SGL: []SGE{{STag: s2.STag(), TO: 0, Len: 1000}}})
			a.waitOK(a.scq, WRSend)
			if wc := b.waitOK(b.rcq, WRRecv); wc.ID != 2 || wc.Bytes != 1000 {
				t.Fatalf("short receive %+v", wc)
			}
			if !bytes.Equal(r1b[3:8], s2b[:5]) || !bytes.Equal(r2b[100:1095], s2b[5:1000]) {
				t.Fatal("short message scattered wrongly")
			}

			// RDMA Write gathering from the same three SGEs.
			sink, sinkBuf := b.reg(len(want)+64, LocalWrite|RemoteWrite)
			a.post(SendWR{ID: 3, Op: WRWrite, SGL: ssgl, Remote: RemoteAddr{STag: sink.STag(), TO: 32}})
			a.waitOK(a.scq, WRWrite)
			// A Send after the Write: its receive completes after the
			// Write's data is placed (RFC 5040 §5.5), which is what lets
			// b's side read sinkBuf.
			a.post(SendWR{ID: 5, Op: WRSend, SGL: []SGE{{STag: s2.STag(), Len: 1}}})
			a.waitOK(a.scq, WRSend)
			if wc := b.waitOK(b.rcq, WRRecv); wc.ID != 3 {
				t.Fatalf("receive after the Write: %+v", wc)
			}
			// Read back (a Read completes after the Write's data is placed).
			back, backBuf := a.reg(len(want)+64, LocalWrite|RemoteWrite)
			src2, err := b.pd.RegisterBytes(sinkBuf, LocalRead|RemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			a.post(SendWR{ID: 4, Op: WRRead, Local: SGE{STag: back.STag(), Len: uint32(len(backBuf))}, Remote: RemoteAddr{STag: src2.STag()}})
			a.waitOK(a.scq, WRRead)
			if !bytes.Equal(sinkBuf[32:32+len(want)], want) || !bytes.Equal(backBuf, sinkBuf) {
				t.Fatal("gathered write data differs")
			}
			zero("sink head", sinkBuf[:32])
			zero("sink tail", sinkBuf[32+len(want):])
		})
	}
}

// TestMaskedAtomics: RFC 7306 masked Fetch-and-Add (the add mask marks
// where carries stop) and masked Compare-and-Swap (RFC 7306 §5.1.1,
// §5.1.2), over the wire: the word afterwards and the original value
// returned.
func TestMaskedAtomics(t *testing.T) {
	type row struct {
		op           WROp
		orig         uint64
		add, addMask uint64 // FetchAdd: add data and mask; CmpSwap: swap data and mask
		cmp, cmpMask uint64
		want         uint64
	}
	rows := []row{
		{op: WRFetchAdd, orig: 0x29, add: 1, want: 0x2A},
		{op: WRFetchAdd, orig: 0xFFFFFFFFFFFFFFFF, add: 1, want: 0},
		{op: WRFetchAdd, orig: 0x00000001FFFFFFFF, add: 0x0000000100000001, want: 0x0000000300000000},
		{op: WRFetchAdd, orig: 0x00000001FFFFFFFF, add: 0x0000000100000001, addMask: 0x8000000080000000, want: 0x0000000200000000},
		{op: WRFetchAdd, orig: 0x00FF00FF00FF00FF, add: 0x0101010101010101, addMask: 0x8080808080808080, want: 0x0100010001000100},
		{op: WRFetchAdd, orig: 0x1234, want: 0x1234}, // probe
		{op: WRCmpSwap, orig: 0x1122334455667788, cmp: 0x1122334400000000, cmpMask: 0xFFFFFFFF00000000,
			add: 0xAAAAAAAABBBBBBBB, addMask: 0x00000000FFFFFFFF, want: 0x11223344BBBBBBBB},
		{op: WRCmpSwap, orig: 0x1122334455667788, cmp: 0x9999999900000000, cmpMask: 0xFFFFFFFF00000000,
			add: 0xAAAAAAAABBBBBBBB, addMask: 0x00000000FFFFFFFF, want: 0x1122334455667788},
		{op: WRCmpSwap, orig: 0x1122334455667788, add: 0xAAAAAAAABBBBBBBB, addMask: ^uint64(0), want: 0xAAAAAAAABBBBBBBB},
	}
	for _, v := range []struct {
		name string
		o    pairOpts
	}{{"rev2-crc", pairOpts{}}, {"rev1-nocrc", pairOpts{rev: 1, noCRC: true}}} {
		t.Run(v.name, func(t *testing.T) {
			a, b := newPair(t, v.o, nil)
			word, wordBuf := b.reg(8*len(rows), LocalRead|LocalWrite|RemoteAtomic)
			res, resBuf := a.reg(8*len(rows), LocalWrite)
			for i, r := range rows {
				binary.NativeEndian.PutUint64(wordBuf[8*i:], r.orig)
				a.post(SendWR{ID: uint64(i), Op: r.op, Local: SGE{STag: res.STag(), TO: uint64(8 * i), Len: 8},
					Remote: RemoteAddr{STag: word.STag(), TO: uint64(8 * i)}, AddSwap: r.add, AddSwapMask: r.addMask,
					Compare: r.cmp, CompareMask: r.cmpMask})
			}
			for i, r := range rows {
				if wc := a.waitOK(a.scq, r.op); wc.ID != uint64(i) {
					t.Fatalf("row %d completed as %d", i, wc.ID)
				}
				name := fmt.Sprintf("row %d (%s %#x)", i, r.op, r.orig)
				if got := binary.NativeEndian.Uint64(wordBuf[8*i:]); got != r.want {
					t.Errorf("%s: memory %#016x, want %#016x", name, got, r.want)
				}
				if got := binary.NativeEndian.Uint64(resBuf[8*i:]); got != r.orig {
					t.Errorf("%s: returned %#016x, want the original %#016x", name, got, r.orig)
				}
			}
		})
	}
}
