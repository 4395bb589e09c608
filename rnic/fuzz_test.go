package rnic

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// FuzzEngineRx feeds arbitrary bytes, as the FPDU stream after the MPA
// exchange, into a QP in RTS and checks the engine's promises on any input:
// no panic, no hang, the stream ends when the input does, and a region with
// no remote rights is never touched. The seeds are well-formed exchanges
// aimed at the QP's regions (fixed keys, so the fuzzer can reach them).
func FuzzEngineRx(f *testing.F) {
	for _, s := range engineSeeds(f) {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, in []byte, crc bool) {
		runEngineInput(t, in, crc)
	})
}

const (
	fuzzKeyW     = 0x11
	fuzzKeyR     = 0x22
	fuzzKeyA     = 0x33
	fuzzKeyGuard = 0x44
)

type fuzzRig struct {
	dev              *Device
	qp               *QP
	w, r, a, g, recv *MR
	guard            []byte
}

func newFuzzRig(t testing.TB) *fuzzRig {
	d, err := Open(Config{Name: "fuzz", Logger: testLogger(), CloseTimeout: 200 * time.Millisecond, MaxMR: 64, MaxMW: 8,
		seed: &[32]byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(64, 0)
	qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, IRD: 4, ORD: 4, InboundRead: true, InboundWrite: true, InboundAtomic: true})
	if err != nil {
		t.Fatal(err)
	}
	rig := &fuzzRig{dev: d, qp: qp, guard: bytes.Repeat([]byte{sentinel}, 4096)}
	reg := func(n int, acc Access, key uint8) *MR {
		mr, err := pd.RegisterMR(Bytes(make([]byte, n)), MROptions{Access: acc, Key: key, FixedKey: true, ZeroBased: true})
		if err != nil {
			t.Fatal(err)
		}
		return mr
	}
	rig.w = reg(4096, LocalRead|LocalWrite|RemoteWrite, fuzzKeyW)
	rig.r = reg(4096, LocalRead|RemoteRead, fuzzKeyR)
	rig.a = reg(64, LocalWrite|RemoteAtomic, fuzzKeyA)
	g, err := pd.RegisterMR(Bytes(rig.guard), MROptions{Access: LocalRead | LocalWrite, Key: fuzzKeyGuard, FixedKey: true, ZeroBased: true})
	if err != nil {
		t.Fatal(err)
	}
	rig.g = g
	rig.recv = reg(256, LocalWrite, 0x55)
	for i := 0; i < 4; i++ {
		qp.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{STag: rig.recv.STag(), TO: uint64(i * 64), Len: 64}}})
	}
	return rig
}

func runEngineInput(t testing.TB, in []byte, crc bool) {
	rig := newFuzzRig(t)
	defer rig.dev.Close()
	ours, theirs := net.Pipe()
	defer theirs.Close()
	if err := rig.qp.Attach(Stream{Conn: ours, CRC: crc, Rev: 2, MULPDU: 1024}); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, theirs) // whatever the engine answers
	theirs.SetWriteDeadline(time.Now().Add(2 * time.Second))
	theirs.Write(in)
	theirs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		st := rig.qp.State()
		if st == StateError || st == StateIdle {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stream did not end after the input did (state %s)", st)
		}
		time.Sleep(time.Millisecond)
	}
	for i, v := range rig.guard {
		if v != sentinel {
			t.Fatalf("region without remote rights written at %d", i)
		}
	}
}

// rigSTags returns the (deterministic) STags of a fuzz rig's regions.
func rigSTags(t testing.TB) (w, r, a uint32) {
	rig := newFuzzRig(t)
	defer rig.dev.Close()
	return uint32(rig.w.STag()), uint32(rig.r.STag()), uint32(rig.a.STag())
}

func engineSeeds(t testing.TB) [][]byte {
	w, r, a := rigSTags(t)
	var msn ddp.TxQueues
	fp := func(hdr, payload []byte) []byte { return mpa.AppendFPDU(nil, hdr, payload, true) }
	untagged := func(op rdmap.Opcode, qn uint32, inv uint32, payload []byte) []byte {
		h := make([]byte, ddp.UntaggedHeaderLen)
		ddp.Untagged(h).Encode(&ddp.UntaggedFields{Last: true, RsvdULP0: rdmap.Ctrl(op), RsvdULP1: inv, QN: qn, MSN: msn.Next(qn)})
		return fp(h, payload)
	}
	tagged := func(op rdmap.Opcode, stag uint32, to uint64, payload []byte) []byte {
		h := make([]byte, ddp.TaggedHeaderLen)
		ddp.Tagged(h).Encode(&ddp.TaggedFields{Last: true, RsvdULP: rdmap.Ctrl(op), STag: stag, TO: to})
		return fp(h, payload)
	}
	var rr [rdmap.ReadRequestLen]byte
	rdmap.ReadRequest(rr[:]).Encode(&rdmap.ReadRequestFields{SinkSTag: 1, Size: 64, SrcSTag: r})
	var ar [rdmap.AtomicRequestLen]byte
	rdmap.AtomicRequest(ar[:]).Encode(&rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: a, TO: 8, AddSwap: 1})
	var imm [8]byte
	seeds := [][]byte{
		tagged(rdmap.OpWrite, 0, 0, nil),
		untagged(rdmap.OpSend, 0, 0, []byte("hello")),
		tagged(rdmap.OpWrite, w, 16, []byte("data")),
		untagged(rdmap.OpReadRequest, 1, 0, rr[:]),
		untagged(rdmap.OpAtomicRequest, 1, 0, ar[:]),
		untagged(rdmap.OpImmediate, 0, 0, imm[:]),
		untagged(rdmap.OpSendInv, 0, w, []byte("x")),
	}
	all := bytes.Join(seeds, nil)
	return append(seeds, all)
}

// TestEngineSeeds runs the fuzz seeds as a plain test.
func TestEngineSeeds(t *testing.T) {
	for _, s := range engineSeeds(t) {
		runEngineInput(t, s, true)
	}
}
