package rdmap

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"
	"testing/quick"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/term"
)

func TestOpcodes(t *testing.T) {
	table := []struct {
		op            Opcode
		ctrl          byte
		tagged        bool
		qn            uint32
		inv, se, atom bool
		name          string
	}{
		{OpWrite, 0x40, true, QNNone, false, false, false, "RDMA Write"},
		{OpReadRequest, 0x41, false, 1, false, false, false, "RDMA Read Request"},
		{OpReadResponse, 0x42, true, QNNone, false, false, false, "RDMA Read Response"},
		{OpSend, 0x43, false, 0, false, false, false, "Send"},
		{OpSendInv, 0x44, false, 0, true, false, false, "Send with Invalidate"},
		{OpSendSE, 0x45, false, 0, false, true, false, "Send with SE"},
		{OpSendSEInv, 0x46, false, 0, true, true, false, "Send with SE and Invalidate"},
		{OpTerminate, 0x47, false, 2, false, false, false, "Terminate"},
		{OpImmediate, 0x48, false, 0, false, false, false, "Immediate Data"},
		{OpImmediateSE, 0x49, false, 0, false, true, false, "Immediate Data with SE"},
		{OpAtomicRequest, 0x4A, false, 1, false, false, true, "Atomic Request"},
		{OpAtomicResponse, 0x4B, false, 3, false, false, true, "Atomic Response"},
	}
	for _, c := range table {
		if Ctrl(c.op) != c.ctrl || c.op.Tagged() != c.tagged || c.op.QN() != c.qn || c.op.HasInvalidate() != c.inv ||
			c.op.Solicited() != c.se || c.op.Atomic() != c.atom || c.op.String() != c.name {
			t.Errorf("%v: ctrl %02x tagged %v qn %d inv %v se %v", c.op, Ctrl(c.op), c.op.Tagged(), c.op.QN(), c.op.HasInvalidate(), c.op.Solicited())
		}
		op, err := ParseCtrl(c.ctrl | 0x30) // Rsv bits are ignored
		if err != nil || op != c.op {
			t.Errorf("ParseCtrl(%02x): %v %v", c.ctrl, op, err)
		}
		if err := CheckPlacement(c.op, c.tagged, c.qn, true); err != nil {
			t.Errorf("%v: %v", c.op, err)
		}
		err = CheckPlacement(c.op, c.tagged, c.qn, false)
		switch {
		case c.op == OpAtomicResponse: // QN 3 does not exist without atomics
			wantCause(t, err, term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN)
		case c.atom:
			wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
		case err != nil:
			t.Errorf("%v without atomics: %v", c.op, err)
		}
		if c.tagged { // QN is ignored for tagged segments
			if err := CheckPlacement(c.op, true, 12345, false); err != nil {
				t.Errorf("%v: %v", c.op, err)
			}
		}
	}
	for b := 0; b < 256; b++ {
		op, err := ParseCtrl(byte(b))
		switch {
		case b&0x0F > 0xB: // the opcode is checked before the version (RFC 5040 §7.2)
			wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
			if Opcode(b&0x0F).String() == "" || Opcode(b&0x0F).QN() != QNNone {
				t.Fatal("unassigned opcode")
			}
		case b>>6 >= 2, b>>6 == 0 && b&0x0F >= 0x8 && b&0x0F <= 0xB:
			// RV 10b and 11b are never valid; RV 00b (RDMA Consortium) is
			// valid (RFC 5040 §4.1) but not for the RFC 7306 opcodes,
			// which MUST carry 01b (RFC 7306 §4.1).
			wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion)
		case err != nil || byte(op) != byte(b&0x0F):
			t.Fatalf("ParseCtrl(%02x) = %v, %v", b, op, err)
		}
	}
	// RFC 5040 §7.2: the opcode (step 2) before the version (step 3).
	for _, rv := range []byte{0x80, 0xC0} {
		_, err := ParseCtrl(rv | 0x0C)
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
		_, err = CheckCtrl(rv|byte(OpWrite), false, 0, true)
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
		_, err = CheckCtrl(rv|byte(OpSend), false, QNReadRequest, true)
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
		_, err = CheckCtrl(rv|byte(OpSend), false, QNSend, true)
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion)
	}
	if op, err := CheckCtrl(0x03, false, QNSend, false); err != nil || op != OpSend {
		t.Fatalf("CheckCtrl(RV 00b Send) = %v, %v", op, err)
	}
	wantCause(t, CheckPlacement(0xC, false, 0, true), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
	wantCause(t, CheckPlacement(OpAtomicResponse, false, 3, false), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN)
	wantCause(t, CheckPlacement(OpSend, false, 4, true), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN)
	wantCause(t, CheckPlacement(OpTerminate, false, 0, true), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
	wantCause(t, CheckPlacement(OpReadResponse, false, 1, true), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
}

// TestAtomicArithmetic: FetchAdd with an add mask and CmpSwap with compare
// and swap masks on a memory word (RFC 7306 §5.1.1, §5.1.2).
func TestAtomicArithmetic(t *testing.T) {
	const ones = ^uint64(0)
	fa := []struct{ orig, add, mask, want uint64 }{
		{0x29, 1, 0, 0x2A},
		{ones, 1, 0, 0},
		{0x00000001FFFFFFFF, 0x0000000100000001, 0, 0x0000000300000000},
		{0x00000001FFFFFFFF, 0x0000000100000001, 0x8000000080000000, 0x0000000200000000},
		{0x00FF00FF00FF00FF, 0x0101010101010101, 0x8080808080808080, 0x0100010001000100},
		{0x123456789ABCDEF0, 0, 0, 0x123456789ABCDEF0},
	}
	for _, c := range fa {
		if got := FetchAdd(c.orig, c.add, c.mask); got != c.want {
			t.Errorf("FetchAdd(%x, %x, %x) = %x, want %x", c.orig, c.add, c.mask, got, c.want)
		}
		if got := refFetchAdd(c.orig, c.add, c.mask); got != c.want {
			t.Errorf("reference FetchAdd(%x, %x, %x) = %x, want %x", c.orig, c.add, c.mask, got, c.want)
		}
	}
	cs := []struct{ orig, swap, swapMask, cmp, cmpMask, want uint64 }{
		{0x1122334455667788, 0xAAAAAAAABBBBBBBB, 0x00000000FFFFFFFF, 0x1122334400000000, 0xFFFFFFFF00000000, 0x11223344BBBBBBBB},
		{0x1122334455667788, 0xAAAAAAAABBBBBBBB, 0x00000000FFFFFFFF, 0x9999999900000000, 0xFFFFFFFF00000000, 0x1122334455667788},
		{0x1122334455667788, 0xAAAAAAAABBBBBBBB, ones, 0, 0, 0xAAAAAAAABBBBBBBB},
	}
	for _, c := range cs {
		if got := CmpSwap(c.orig, c.swap, c.swapMask, c.cmp, c.cmpMask); got != c.want {
			t.Errorf("CmpSwap(%x) = %x, want %x", c.orig, got, c.want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		o, a, m := rng.Uint64(), rng.Uint64(), rng.Uint64()
		if rng.IntN(4) == 0 {
			m = 0
		}
		if FetchAdd(o, a, m) != refFetchAdd(o, a, m) {
			t.Fatalf("FetchAdd(%x, %x, %x) = %x, reference %x", o, a, m, FetchAdd(o, a, m), refFetchAdd(o, a, m))
		}
	}
}

// refFetchAdd is RFC 7306 §5.1.1's bit-serial pseudocode.
func refFetchAdd(orig, add, mask uint64) uint64 {
	var carry, out uint64
	for bit := range 64 {
		loc := uint64(1) << bit
		sum := carry + (orig&loc)>>bit + (add&loc)>>bit
		carry = (sum & 2) >> 1
		if sum&1 != 0 {
			out |= loc
		}
		if mask&loc != 0 {
			carry = 0
		}
	}
	return out
}

func TestParseLengths(t *testing.T) {
	for n := range TerminateMaxLen + 2 {
		b := make([]byte, n)
		_, e1 := ParseReadRequest(b)
		_, e2 := ParseAtomicRequest(b)
		_, e3 := ParseAtomicResponse(b)
		_, e4 := ParseImmediate(b)
		for i, e := range []error{e1, e2, e3, e4} {
			want := []int{ReadRequestLen, AtomicRequestLen, AtomicResponseLen, ImmediateLen}[i]
			if n == want {
				if e != nil {
					t.Fatalf("length %d rejected: %v", n, e)
				}
				continue
			}
			wantCause(t, e, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified)
		}
	}
	// Unsupported atomic codes; reserved bits ignored.
	for code := range 16 {
		b := arBytes(ar22)
		b[3] = byte(code) | 0xF0
		b[0] = 0xFF
		a, err := ParseAtomicRequest(b)
		if code == AtomicFetchAdd || code == AtomicCmpSwap {
			if err != nil || a.AOpcode() != uint8(code) {
				t.Fatalf("AOpCode %d: %v", code, err)
			}
			continue
		}
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode)
	}
}

func TestRoundTrips(t *testing.T) {
	rr := func(f ReadRequestFields) bool {
		b := make(ReadRequest, ReadRequestLen)
		b.Encode(&f)
		r, err := ParseReadRequest(b)
		return err == nil && r.Fields() == f
	}
	ar := func(f AtomicRequestFields, cmpSwap bool) bool {
		f.AOpcode = AtomicFetchAdd
		if cmpSwap {
			f.AOpcode = AtomicCmpSwap
		}
		b := make(AtomicRequest, AtomicRequestLen)
		b.Encode(&f)
		a, err := ParseAtomicRequest(b)
		return err == nil && a.Fields() == f && b[0]|b[1]|b[2]|b[3]&0xF0 == 0
	}
	resp := func(f AtomicResponseFields) bool {
		b := make(AtomicResponse, AtomicResponseLen)
		b.Encode(&f)
		a, err := ParseAtomicResponse(b)
		return err == nil && a.Fields() == f
	}
	imm := func(v uint64) bool {
		b := make(Immediate, ImmediateLen)
		b.SetData(v)
		m, err := ParseImmediate(b)
		return err == nil && m.Data() == v
	}
	for _, fn := range []any{rr, ar, resp, imm} {
		if err := quick.Check(fn, &quick.Config{MaxCount: 3000}); err != nil {
			t.Fatal(err)
		}
	}
}

// randTerminate returns a random TerminateFields in normal form: what
// AppendTerminate writes and ParseTerminate reads back unchanged.
func randTerminate(rng *rand.Rand) TerminateFields {
	f := TerminateFields{Cause: term.Cause{Layer: term.Layer(rng.IntN(3)), EType: term.EType(rng.IntN(3)), Code: term.Code(rng.Uint32())}}
	if f.Cause.Layer == term.LayerLLP {
		f.Cause.EType = term.EType(rng.IntN(16))
	}
	f.M, f.D = rng.IntN(2) == 0, rng.IntN(2) == 0
	if f.M || f.D {
		f.SegLen = uint16(rng.Uint32())
	}
	if f.D {
		rnd := func(n int) []byte {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}
		f.R = rng.IntN(2) == 0
		if rng.IntN(2) == 0 {
			f.DDPHeader = rnd(ddp.TaggedHeaderLen)
			f.DDPHeader[0] |= ddp.FlagTagged
		} else {
			f.DDPHeader = rnd(ddp.UntaggedHeaderLen)
			f.DDPHeader[0] &^= ddp.FlagTagged
			if f.R && rng.IntN(3) > 0 {
				f.DDPHeader[1] = Ctrl(OpReadRequest)
				f.RDMAHeader = rnd(ReadRequestLen)
			} else if echoesReadRequest(f.DDPHeader) {
				f.DDPHeader[1] = Ctrl(OpSend)
			}
		}
	}
	return f
}

func TestTerminateRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		f := randTerminate(rng)
		b := AppendTerminate([]byte{0xEE}, &f)
		g, err := ParseTerminate(b[1:])
		if err != nil || !reflect.DeepEqual(f, g) {
			t.Fatalf("%+v\n-> % x\n-> %+v %v", f, b[1:], g, err)
		}
		if len(b)-1 > TerminateMaxLen || len(b)-1 < TerminateMinLen {
			t.Fatalf("length %d", len(b)-1)
		}
	}
}

func TestParseTerminateForms(t *testing.T) {
	rr := untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu()
	sendInv := untagged(OpSendInv, QNSend, 3, 0x11223344, nil).ulpdu()
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	ok := []struct {
		name string
		b    []byte
		want TerminateFields
	}{
		{"4-byte form", []byte{0x20, 0x02, 0, 0}, TerminateFields{Cause: term.Cause{Layer: 2, EType: 0, Code: 2}}},
		{"zero-filled 52", cat([]byte{0x02, 0x06, 0, 0}, make([]byte, 48)), TerminateFields{Cause: term.Cause{Layer: 0, EType: 2, Code: 6}}},
		{"reserved bits ignored", []byte{0x02, 0x06, 0x1F, 0xFF}, TerminateFields{Cause: term.Cause{Layer: 0, EType: 2, Code: 6}}},
		{"siw Send-Inv: M D R, no RDMA header", cat([]byte{0x01, 0x09, 0xE0, 0, 0, 0x12}, sendInv),
			TerminateFields{Cause: term.Cause{Layer: 0, EType: 1, Code: 9}, M: true, D: true, R: true, SegLen: 0x12, DDPHeader: sendInv}},
		{"siw Send-Inv zero-filled", cat([]byte{0x01, 0x09, 0xE0, 0, 0, 0x12}, sendInv, make([]byte, 28)),
			TerminateFields{Cause: term.Cause{Layer: 0, EType: 1, Code: 9}, M: true, D: true, R: true, SegLen: 0x12, DDPHeader: sendInv}},
		{"Read Request with R but no bytes", cat([]byte{0x01, 0x00, 0xE0, 0, 0, 0x2e}, rr[:18]),
			TerminateFields{Cause: term.Cause{Layer: 0, EType: 1, Code: 0}, M: true, D: true, R: true, SegLen: 0x2e, DDPHeader: rr[:18]}},
		{"Read Request without R, zero-filled", cat([]byte{0x01, 0x00, 0xC0, 0, 0, 0x2e}, rr[:18], make([]byte, 28)),
			TerminateFields{Cause: term.Cause{Layer: 0, EType: 1, Code: 0}, M: true, D: true, SegLen: 0x2e, DDPHeader: rr[:18]}},
		{"M only", []byte{0x12, 0x05, 0x80, 0, 0x01, 0x00}, TerminateFields{Cause: term.Cause{Layer: 1, EType: 2, Code: 5}, M: true, SegLen: 256}},
	}
	for _, c := range ok {
		f, err := ParseTerminate(c.b)
		if err != nil || !reflect.DeepEqual(f, c.want) {
			t.Errorf("%s: %+v %v", c.name, f, err)
		}
	}
	bad := []struct {
		name string
		b    []byte
	}{
		{"3 bytes", []byte{0x02, 0x06, 0}},
		{"53 bytes", make([]byte, 53)},
		{"layer 3", []byte{0x30, 0, 0, 0}},
		{"RDMA EType 3", []byte{0x03, 0, 0, 0}},
		{"DDP EType 5", []byte{0x15, 0, 0, 0}},
		{"M without length", []byte{0x12, 0x05, 0x80, 0}},
		{"D without header", []byte{0x12, 0x05, 0xC0, 0, 0, 0x16}},
		{"D with short header", cat([]byte{0x12, 0x05, 0xC0, 0, 0, 0x16}, rr[:17])},
		{"tagged header cut", cat([]byte{0x11, 0x00, 0xC0, 0, 0, 0x16}, []byte{0xC1, 0x40, 1, 2, 3})},
		{"R without D", []byte{0x01, 0x00, 0x20, 0, 0, 0}},
		{"RDMA header cut", cat([]byte{0x01, 0x00, 0xE0, 0, 0, 0x2e}, rr[:40])},
		{"trailing garbage", []byte{0x02, 0x06, 0, 0, 0, 1}},
		{"garbage after header", cat([]byte{0x12, 0x05, 0xC0, 0, 0, 0x16}, sendInv, []byte{0, 7})},
	}
	for _, c := range bad {
		_, err := ParseTerminate(c.b)
		if err == nil {
			t.Errorf("%s accepted", c.name)
			continue
		}
		wantCause(t, err, term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified)
	}
	// AppendTerminate normalises what it cannot represent.
	f := TerminateFields{Cause: term.Cause{Layer: 1, EType: 1}, R: true, RDMAHeader: rr[18:]}
	if b := AppendTerminate(nil, &f); !bytes.Equal(b, []byte{0x11, 0, 0, 0}) {
		t.Fatalf("R without D: % x", b)
	}
	f = TerminateFields{Cause: term.Cause{Layer: 1, EType: 2}, M: true, D: true, DDPHeader: []byte{0x41, 0x43}}
	if b := AppendTerminate(nil, &f); len(b) != 4+2+18 || b[6] != 0x41 || b[7] != 0x43 {
		t.Fatalf("short header not padded: % x", b)
	}
	// Parsed slices are copies.
	src := cat([]byte{0x01, 0x00, 0xE0, 0, 0, 0x2e}, rr)
	g, _ := ParseTerminate(src)
	clear(src)
	if !bytes.Equal(g.DDPHeader, rr[:18]) || !bytes.Equal(g.RDMAHeader, rr[18:]) {
		t.Fatal("ParseTerminate aliases its input")
	}
}

func TestNoAllocs(t *testing.T) {
	rr := make([]byte, ReadRequestLen)
	ar := arBytes(ar22)
	resp := make([]byte, AtomicResponseLen)
	imm := make([]byte, ImmediateLen)
	var sink uint64
	n := testing.AllocsPerRun(100, func() {
		op, _ := ParseCtrl(0x41)
		_ = CheckPlacement(op, false, 1, true)
		ReadRequest(rr).Encode(&rr11)
		r, _ := ParseReadRequest(rr)
		a, _ := ParseAtomicRequest(ar)
		AtomicResponse(resp).Encode(&AtomicResponseFields{ReqID: 3, Original: 4})
		p, _ := ParseAtomicResponse(resp)
		Immediate(imm).SetData(7)
		m, _ := ParseImmediate(imm)
		sink += r.SrcTO() + uint64(r.Size()) + a.AddSwap() + p.Original() + m.Data() +
			FetchAdd(1, 2, 3) + CmpSwap(1, 2, 3, 4, 5)
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
	_ = sink
}
