package rdmap

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/rnic-dev/rnic/internal/wiretest"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/term"
)

var (
	hx        = wiretest.Hex
	wantCause = wiretest.WantCause
)

// seg is one DDP segment: its header fields and the bytes after the header.
type seg struct {
	tagged bool
	t      ddp.TaggedFields
	u      ddp.UntaggedFields
	body   []byte
}

func (s seg) ulpdu() []byte {
	if s.tagged {
		h := make(ddp.Tagged, ddp.TaggedHeaderLen)
		h.Encode(&s.t)
		return append(h, s.body...)
	}
	h := make(ddp.Untagged, ddp.UntaggedHeaderLen)
	h.Encode(&s.u)
	return append(h, s.body...)
}

func (s seg) fpdu(crc bool) []byte {
	u := s.ulpdu()
	hl := ddp.UntaggedHeaderLen
	if s.tagged {
		hl = ddp.TaggedHeaderLen
	}
	return mpa.AppendFPDU(nil, u[:hl], u[hl:], crc)
}

func untagged(op Opcode, qn, msn, inv uint32, body []byte) seg {
	return seg{u: ddp.UntaggedFields{Last: true, RsvdULP0: Ctrl(op), RsvdULP1: inv, QN: qn, MSN: msn}, body: body}
}

func taggedSeg(op Opcode, last bool, stag uint32, to uint64, body []byte) seg {
	return seg{tagged: true, t: ddp.TaggedFields{Last: last, RsvdULP: Ctrl(op), STag: stag, TO: to}, body: body}
}

var (
	rr11 = ReadRequestFields{SinkSTag: 0xAB01, SinkTO: 0x2000, Size: 4096, SrcSTag: 0x12345678, SrcTO: 0x1000}
	rr16 = ReadRequestFields{SinkSTag: 0xAB01, SinkTO: 0x2000, Size: 0, SrcSTag: 0xFFFFFFFF, SrcTO: 0xFFFFFFFFFFFFFFF0}
	ar22 = AtomicRequestFields{AOpcode: AtomicFetchAdd, ReqID: 1, STag: 0x12345678, TO: 0x1008, AddSwap: 1,
		CompareMask: ^uint64(0)}
	ar24 = AtomicRequestFields{AOpcode: AtomicCmpSwap, ReqID: 2, STag: 0x12345678, TO: 0x1010,
		AddSwap: 0xAAAAAAAABBBBBBBB, AddSwapMask: 0x00000000FFFFFFFF, Compare: 0x1122334400000000, CompareMask: 0xFFFFFFFF00000000}
	write12 = []byte{0, 1, 2, 3, 4, 5, 6, 7}
)

func rrBytes(f ReadRequestFields) []byte {
	b := make(ReadRequest, ReadRequestLen)
	b.Encode(&f)
	return b
}

func arBytes(f AtomicRequestFields) []byte {
	b := make(AtomicRequest, AtomicRequestLen)
	b.Encode(&f)
	return b
}

func termBody(cause term.Cause, offending []byte, ulpduLen int) []byte {
	f := TerminateFor(cause, offending, ulpduLen)
	return AppendTerminate(nil, &f)
}

// vectors are known-answer FPDUs (untagged and tagged messages, Terminates,
// RFC 7306 atomics and Immediate Data), each with the segment our encoders
// build for it.
func vectors() []struct {
	name string
	hex  string
	seg  seg
	crc  bool
} {
	imm := func(v uint64) []byte { b := make(Immediate, 8); b.SetData(v); return b }
	resp := make(AtomicResponse, AtomicResponseLen)
	resp.Encode(&AtomicResponseFields{ReqID: 1, Original: 0x29})
	badWrite := taggedSeg(OpWrite, true, 0xDEADBEEF, 0, write12).ulpdu()
	rr := untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu()
	fa := untagged(OpAtomicRequest, QNReadRequest, 2, 0, arBytes(ar22)).ulpdu()
	return []struct {
		name string
		hex  string
		seg  seg
		crc  bool
	}{
		{"#7 Send hello", "00 17 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 68 65 6c 6c 6f 00 00 00 b9 90 b1 0c",
			untagged(OpSend, QNSend, 1, 0, []byte("hello")), true},
		{"#8 Send hello, CRC off", "00 17 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 68 65 6c 6c 6f 00 00 00 00 00 00 00",
			untagged(OpSend, QNSend, 1, 0, []byte("hello")), false},
		{"#9 Send SE zero length", "00 12 41 45 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00 9f 74 6d 49",
			untagged(OpSendSE, QNSend, 2, 0, nil), true},
		{"#10 Send with Invalidate", "00 16 41 44 11 22 33 44 00 00 00 00 00 00 00 03 00 00 00 00 61 62 63 64 23 ac ff cd",
			untagged(OpSendInv, QNSend, 3, 0x11223344, []byte("abcd")), true},
		{"#11 Read Request", "00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 ab 01 00 00 00 00 00 00 20 00" +
			"00 00 10 00 12 34 56 78 00 00 00 00 00 00 10 00 36 f3 9c 87",
			untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)), true},
		{"#12 Write", "00 16 c1 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 04 05 06 07 ea ef b4 f7",
			taggedSeg(OpWrite, true, 0x12345678, 0x1000, write12), true},
		{"#13 Write segment 1", "00 12 81 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 53 bc f2 9d",
			taggedSeg(OpWrite, false, 0x12345678, 0x1000, write12[:4]), true},
		{"#13 Write segment 2", "00 12 c1 40 12 34 56 78 00 00 00 00 00 00 10 04 04 05 06 07 1a 70 2f c5",
			taggedSeg(OpWrite, true, 0x12345678, 0x1004, write12[4:]), true},
		{"#14 zero-length Write", "00 0e c1 40 12 34 56 78 00 00 00 00 00 00 10 00 c5 99 e9 a9",
			taggedSeg(OpWrite, true, 0x12345678, 0x1000, nil), true},
		{"#15 Read Response", "00 16 c1 42 00 00 ab 01 00 00 00 00 00 00 20 00 00 01 02 03 04 05 06 07 68 f2 f9 5d",
			taggedSeg(OpReadResponse, true, rr11.SinkSTag, rr11.SinkTO, write12), true},
		{"#16 zero-length Read Request", "00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 02 00 00 00 00 00 00 ab 01 00 00 00 00 00 00 20 00" +
			"00 00 00 00 ff ff ff ff ff ff ff ff ff ff ff f0 bf 64 a7 77",
			untagged(OpReadRequest, QNReadRequest, 2, 0, rrBytes(rr16)), true},
		{"#16 zero-length Read Response", "00 0e c1 42 00 00 ab 01 00 00 00 00 00 00 20 00 de e0 37 3b",
			taggedSeg(OpReadResponse, true, rr16.SinkSTag, rr16.SinkTO, nil), true},
		{"#17 Terminate DDP invalid STag", "00 26 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 11 00 c0 00 00 16 c1 40 de ad be ef" +
			"00 00 00 00 00 00 00 00 25 b2 d5 88",
			untagged(OpTerminate, QNTerminate, 1, 0, termBody(term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidSTag}, badWrite, len(badWrite))), true},
		{"#18 Terminate Read Request invalid STag", "00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 01 00 e0 00 00 2e 41 41 00 00 00 00" +
			"00 00 00 01 00 00 00 01 00 00 00 00 00 00 ab 01 00 00 00 00 00 00 20 00 00 00 10 00 12 34 56 78" +
			"00 00 00 00 00 00 10 00 cf e2 11 9e",
			untagged(OpTerminate, QNTerminate, 1, 0, termBody(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtInvalidSTag}, rr, len(rr))), true},
		{"#19 Terminate unexpected opcode", "00 16 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 02 06 00 00 6f 77 b9 73",
			untagged(OpTerminate, QNTerminate, 1, 0, termBody(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode}, nil, 0)), true},
		{"#20 Terminate MPA CRC", "00 16 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 20 02 00 00 7f e4 25 85",
			untagged(OpTerminate, QNTerminate, 1, 0, termBody(term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPACRC}, nil, 0)), true},
		{"#22 FetchAdd request", "00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 02 00 00 00 00 00 00 00 00 00 00 00 01 12 34 56 78" +
			"00 00 00 00 00 00 10 08 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00" +
			"ff ff ff ff ff ff ff ff 1d 0e da 5d",
			untagged(OpAtomicRequest, QNReadRequest, 2, 0, arBytes(ar22)), true},
		{"#23 Atomic Response", "00 1e 41 4b 00 00 00 00 00 00 00 03 00 00 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 29 eb f3 f1 db",
			untagged(OpAtomicResponse, QNAtomicResponse, 1, 0, resp), true},
		{"#24 CmpSwap request", "00 46 41 4a 00 00 00 00 00 00 00 01 00 00 00 03 00 00 00 00 00 00 00 02 00 00 00 02 12 34 56 78" +
			"00 00 00 00 00 00 10 10 aa aa aa aa bb bb bb bb 00 00 00 00 ff ff ff ff 11 22 33 44 00 00 00 00" +
			"ff ff ff ff 00 00 00 00 f1 a8 3d 13",
			untagged(OpAtomicRequest, QNReadRequest, 3, 0, arBytes(ar24)), true},
		{"#25 Immediate Data", "00 1a 41 48 00 00 00 00 00 00 00 00 00 00 00 04 00 00 00 00 01 02 03 04 05 06 07 08 f7 1b b2 f6",
			untagged(OpImmediate, QNSend, 4, 0, imm(0x0102030405060708)), true},
		{"#25 Immediate Data with SE", "00 1a 41 49 00 00 00 00 00 00 00 00 00 00 00 05 00 00 00 00 ca fe ba be de ad be ef 10 89 4c 3d",
			untagged(OpImmediateSE, QNSend, 5, 0, imm(0xCAFEBABEDEADBEEF)), true},
		{"#26 Terminate misaligned atomic", "00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 02 07 c0 00 00 46 41 4a 00 00 00 00" +
			"00 00 00 01 00 00 00 02 00 00 00 00 72 18 66 92",
			untagged(OpTerminate, QNTerminate, 1, 0, termBody(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpCatastrophicStream}, fa, len(fa))), true},
	}
}

// decoded is what the decoders recover from one ULPDU.
type decoded struct {
	op     Opcode
	tagged bool
	t      ddp.TaggedFields
	u      ddp.UntaggedFields
	rr     *ReadRequestFields
	ar     *AtomicRequestFields
	resp   *AtomicResponseFields
	imm    *uint64
	term   *TerminateFields
	body   []byte
}

// decode runs the receive-side decoders in the engine's order (RFC 5040
// §7.2: DDP fields, then the opcode, then the RDMA version).
func decode(ulpdu []byte) (decoded, error) {
	var d decoded
	var hl int
	var qn uint32
	if ddp.IsTagged(ulpdu[0]) {
		h, err := ddp.ParseTagged(ulpdu)
		if err != nil {
			return d, err
		}
		d.tagged, d.t, hl = true, h.Fields(), ddp.TaggedHeaderLen
	} else {
		h, err := ddp.ParseUntagged(ulpdu)
		if err != nil {
			return d, err
		}
		d.u, hl, qn = h.Fields(), ddp.UntaggedHeaderLen, h.QN()
	}
	op, err := CheckCtrl(ulpdu[1], d.tagged, qn, true)
	if err != nil {
		return d, err
	}
	d.op, d.body = op, ulpdu[hl:]
	switch op {
	case OpReadRequest:
		r, err := ParseReadRequest(d.body)
		if err != nil {
			return d, err
		}
		f := r.Fields()
		d.rr = &f
	case OpAtomicRequest:
		a, err := ParseAtomicRequest(d.body)
		if err != nil {
			return d, err
		}
		f := a.Fields()
		d.ar = &f
	case OpAtomicResponse:
		a, err := ParseAtomicResponse(d.body)
		if err != nil {
			return d, err
		}
		f := a.Fields()
		d.resp = &f
	case OpImmediate, OpImmediateSE:
		m, err := ParseImmediate(d.body)
		if err != nil {
			return d, err
		}
		v := m.Data()
		d.imm = &v
	case OpTerminate:
		f, err := ParseTerminate(d.body)
		if err != nil {
			return d, err
		}
		d.term = &f
	}
	return d, nil
}

// readFPDUs reads every FPDU of a stream with the mpa Reader.
func readFPDUs(t *testing.T, stream []byte, crc bool) [][]byte {
	t.Helper()
	r := mpa.NewReader(bytes.NewReader(stream), mpa.ReaderConfig{CRC: crc})
	var out [][]byte
	for {
		n, err := r.Next()
		if err != nil {
			if len(out) == 0 || err.Error() != "EOF" {
				t.Fatalf("Next: %v", err)
			}
			return out
		}
		u := make([]byte, n)
		if err := r.ReadFull(u); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
}

func TestVectors(t *testing.T) {
	for _, v := range vectors() {
		t.Run(v.name, func(t *testing.T) {
			want := hx(t, v.hex)
			if got := v.seg.fpdu(v.crc); !bytes.Equal(got, want) {
				t.Fatalf("encode\n got % x\nwant % x", got, want)
			}
			us := readFPDUs(t, want, v.crc)
			if len(us) != 1 {
				t.Fatalf("%d FPDUs", len(us))
			}
			d, err := decode(us[0])
			if err != nil {
				t.Fatal(err)
			}
			if d.tagged != v.seg.tagged || d.t != v.seg.t || d.u != v.seg.u {
				t.Fatalf("DDP fields %+v %+v, want %+v %+v", d.t, d.u, v.seg.t, v.seg.u)
			}
			ctrl := v.seg.u.RsvdULP0
			if v.seg.tagged {
				ctrl = v.seg.t.RsvdULP
			}
			if Ctrl(d.op) != ctrl {
				t.Fatalf("opcode %v", d.op)
			}
			if !bytes.Equal(d.body, v.seg.body) {
				t.Fatalf("body % x, want % x", d.body, v.seg.body)
			}
			switch {
			case d.rr != nil:
				if !bytes.Equal(rrBytes(*d.rr), v.seg.body) {
					t.Fatal("Read Request fields")
				}
			case d.ar != nil:
				if *d.ar != ar22 && *d.ar != ar24 {
					t.Fatalf("atomic fields %+v", *d.ar)
				}
			case d.resp != nil:
				if *d.resp != (AtomicResponseFields{ReqID: 1, Original: 0x29}) {
					t.Fatalf("response %+v", *d.resp)
				}
			case d.term != nil:
				if again := AppendTerminate(nil, d.term); !bytes.Equal(again, v.seg.body) {
					t.Fatalf("Terminate re-encodes to % x", again)
				}
			}
		})
	}
	// Spot checks of decoded values.
	byName := func(name string) decoded {
		t.Helper()
		for _, v := range vectors() {
			if v.name == name {
				d, err := decode(v.seg.ulpdu())
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
		}
		t.Fatalf("no vector %q", name)
		return decoded{}
	}
	if d := byName("#10 Send with Invalidate"); d.u.RsvdULP1 != 0x11223344 || !d.op.HasInvalidate() || d.op.Solicited() {
		t.Fatal("#10 invalidate STag")
	}
	if d := byName("#25 Immediate Data with SE"); *d.imm != 0xCAFEBABEDEADBEEF || !d.op.Solicited() {
		t.Fatal("#25 SE")
	}
	if d := byName("#18 Terminate Read Request invalid STag"); !d.term.M || !d.term.D || !d.term.R || d.term.SegLen != 0x2e ||
		!bytes.Equal(d.term.RDMAHeader, rrBytes(rr11)) {
		t.Fatalf("#18 %+v", *d.term)
	}
	if d := byName("#17 Terminate DDP invalid STag"); d.term.Cause != (term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidSTag}) ||
		len(d.term.DDPHeader) != ddp.TaggedHeaderLen || d.term.R || d.term.SegLen != 0x16 {
		t.Fatalf("#17 %+v", *d.term)
	}
	if d := byName("#26 Terminate misaligned atomic"); !d.term.D || d.term.R || len(d.term.DDPHeader) != 18 || d.term.RDMAHeader != nil {
		t.Fatalf("#26 %+v", *d.term)
	}
	if d := byName("#20 Terminate MPA CRC"); d.term.M || d.term.D || d.term.Cause.Code != term.MPACRC || len(d.body) != TerminateMinLen {
		t.Fatalf("#20 %+v", *d.term)
	}
}

// The vectors as one connection's stream: sequence state per QN accepts
// them in order and rejects them out of order.
func TestVectorStream(t *testing.T) {
	order := []string{"#7 Send hello", "#9 Send SE zero length", "#10 Send with Invalidate", "#11 Read Request",
		"#12 Write", "#22 FetchAdd request", "#23 Atomic Response", "#24 CmpSwap request", "#13 Write segment 1",
		"#13 Write segment 2", "#25 Immediate Data", "#25 Immediate Data with SE", "#17 Terminate DDP invalid STag"}
	byName := map[string][]byte{}
	for _, v := range vectors() {
		byName[v.name] = hx(t, v.hex)
	}
	var stream []byte
	for _, n := range order {
		stream = append(stream, byName[n]...)
	}
	q := ddp.NewRxQueues(4)
	us := readFPDUs(t, stream, true)
	if len(us) != len(order) {
		t.Fatalf("%d FPDUs", len(us))
	}
	for i, u := range us {
		d, err := decode(u)
		if err != nil {
			t.Fatalf("%s: %v", order[i], err)
		}
		if d.tagged || d.op == OpTerminate {
			continue
		}
		h := ddp.Untagged(u)
		if err := q.Check(h, len(d.body)); err != nil {
			t.Fatalf("%s: %v", order[i], err)
		}
		q.Advance(h, len(d.body))
	}
	if q.ExpectedMSN(QNSend) != 6 || q.ExpectedMSN(QNReadRequest) != 4 || q.ExpectedMSN(QNAtomicResponse) != 2 {
		t.Fatalf("MSNs %d %d %d", q.ExpectedMSN(0), q.ExpectedMSN(1), q.ExpectedMSN(3))
	}
	// #9 (MSN 2) before #7: MSN range error.
	q = ddp.NewRxQueues(4)
	h := ddp.Untagged(hx(t, "41 45 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00"))
	wantCause(t, q.Check(h, 0), term.LayerDDP, term.DDPUntagged, term.UntaggedMSNRange)
}

// TestTerminateCodes: the Terminate causes of RFC 5040 §4.8 (Figure 9) and
// of DDP that a decoder can detect, with the headers TerminateFor echoes
// for each (Figure 10).
func TestTerminateCodes(t *testing.T) {
	send := untagged(OpSend, QNSend, 1, 0, []byte("hello")).ulpdu()
	rr := untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu()
	write := taggedSeg(OpWrite, true, 0x12345678, 0x1000, write12).ulpdu()
	mod := func(b []byte, i int, v byte) []byte { c := bytes.Clone(b); c[i] = v; return c }
	put32 := func(b []byte, i int, v uint32) []byte {
		c := bytes.Clone(b)
		c[i], c[i+1], c[i+2], c[i+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		return c
	}
	rows := []struct {
		name    string
		ulpdu   []byte
		l       term.Layer
		e       term.EType
		c       term.Code
		echoDDP bool
	}{
		{"QN 7", put32(send, 6, 7), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN, true},
		{"QN 3 without atomics is checked with atomics on", put32(send, 6, 4), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN, true},
		{"tagged DV=0", mod(write, 0, 0xC0), term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion, true},
		{"untagged DV=0", mod(send, 0, 0x40), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion, true},
		// RV 00b is valid (RFC 5040 §4.1, "Both version numbers are
		// valid"), so the invalid versions are 10b and 11b.
		{"RV=2", mod(send, 1, 0x83), term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion, true},
		{"RV=3", mod(send, 1, 0xC3), term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion, true},
		{"RV=0 on an RFC 7306 opcode", mod(untagged(OpImmediate, QNSend, 1, 0, make([]byte, ImmediateLen)).ulpdu(), 1, 0x08), term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion, true},
		{"opcode 0xC", mod(send, 1, 0x4C), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		// Two faults: RFC 5040 §7.2 validates the opcode (2) before the
		// version (3), and the DDP fields (1) before both.
		{"opcode 0xC and RV=2", mod(send, 1, 0x8C), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"untagged Write and RV=3", mod(send, 1, 0xC0), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"Send on QN 1 and RV=2", mod(put32(send, 6, 1), 1, 0x83), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"QN 7 and opcode 0xC", mod(put32(send, 6, 7), 1, 0x4C), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN, true},
		{"untagged DV=0 and opcode 0xC", mod(mod(send, 0, 0x40), 1, 0x8C), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion, true},
		{"Send on QN 1", put32(send, 6, 1), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"tagged Send", mod(write, 1, 0x43), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"untagged Write", mod(send, 1, 0x40), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"Immediate of 4 bytes", untagged(OpImmediate, QNSend, 1, 0, []byte{1, 2, 3, 4}).ulpdu(), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified, true},
		{"Read Request of 27 bytes", rr[:len(rr)-1], term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified, true},
		{"AOpCode 1", untagged(OpAtomicRequest, QNReadRequest, 1, 0, mod(arBytes(ar22), 3, 1)).ulpdu(), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode, true},
		{"Atomic Response of 11 bytes", untagged(OpAtomicResponse, QNAtomicResponse, 1, 0, make([]byte, 11)).ulpdu(), term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified, true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			_, err := decode(r.ulpdu)
			wantCause(t, err, r.l, r.e, r.c)
			var te *term.Error
			errors.As(err, &te)
			f := TerminateFor(te.Cause, r.ulpdu, len(r.ulpdu))
			if f.D != r.echoDDP || f.M != r.echoDDP || f.R {
				t.Fatalf("echo M=%v D=%v R=%v, want D=%v", f.M, f.D, f.R, r.echoDDP)
			}
			if f.D && !bytes.Equal(f.DDPHeader, r.ulpdu[:len(f.DDPHeader)]) {
				t.Fatal("echoed header differs")
			}
			b := AppendTerminate(nil, &f)
			g, err := ParseTerminate(b)
			if err != nil || !reflect.DeepEqual(g, f) {
				t.Fatalf("round trip %+v %v", g, err)
			}
		})
	}
	// Engine-detected rows: the echo rules TerminateFor applies to them.
	echo := []struct {
		name       string
		cause      term.Cause
		ulpdu      []byte
		d, r       bool
		headerSize int
	}{
		{"no posted receive", term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer}, send, true, false, 18},
		{"Send too long", term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedTooLong}, send, true, false, 18},
		{"Write beyond bounds", term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedBaseBounds}, write, true, false, 14},
		{"Write TO wrap", term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedTOWrap}, write, true, false, 14},
		{"Write other PD", term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedNotAssociated}, write, true, false, 14},
		{"Read Request beyond bounds", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtBaseBounds}, rr, true, true, 18},
		{"Read Request without remote read", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtAccessRights}, rr, true, true, 18},
		{"Read Request, header only", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtAccessRights}, rr[:18], true, false, 18},
		{"Send-Inv foreign STag", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtCannotInvalidate},
			untagged(OpSendInv, QNSend, 1, 9, nil).ulpdu(), true, false, 18},
		{"IRD exceeded", term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer}, rr, true, false, 18},
		{"Read Response unexpected", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode},
			taggedSeg(OpReadResponse, true, 1, 0, nil).ulpdu(), true, false, 14},
		{"local catastrophic", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}, send, false, false, 0},
		// RFC 5040 Figure 10: every DDP error echoes the DDP header ("Yes").
		{"DDP local catastrophic", term.Cause{Layer: term.LayerDDP, EType: term.DDPLocalCatastrophic}, send, true, false, 18},
		{"DDP version, tagged", term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidVersion}, write, true, false, 14},
		{"DDP version, untagged", term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedInvalidVersion}, send, true, false, 18},
		{"MPA CRC", term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPACRC}, send, false, false, 0},
		{"DDP header cut short (zero-padded)", term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedInvalidVersion}, send[:15], true, false, 18},
		{"RDMAP header cut short", term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode}, send[:17], false, false, 0},
	}
	for _, e := range echo {
		f := TerminateFor(e.cause, e.ulpdu, 70000)
		if f.D != e.d || f.M != e.d || f.R != e.r || len(f.DDPHeader) != e.headerSize {
			t.Errorf("%s: M=%v D=%v R=%v header %d", e.name, f.M, f.D, f.R, len(f.DDPHeader))
		}
		if f.D && f.SegLen != 0xFFFF {
			t.Errorf("%s: SegLen %d not clamped", e.name, f.SegLen)
		}
		if e.r && !bytes.Equal(f.RDMAHeader, rr[18:]) {
			t.Errorf("%s: RDMA header", e.name)
		}
		if n := min(len(e.ulpdu), e.headerSize); f.D && (!bytes.Equal(f.DDPHeader[:n], e.ulpdu[:n]) || !bytes.Equal(f.DDPHeader[n:], make([]byte, e.headerSize-n))) {
			t.Errorf("%s: echoed DDP header %x", e.name, f.DDPHeader)
		}
	}
	// TerminateFor copies: later changes to the offending bytes do not leak in.
	buf := bytes.Clone(rr)
	f := TerminateFor(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection}, buf, len(buf))
	clear(buf)
	if !bytes.Equal(f.DDPHeader, rr[:18]) || !bytes.Equal(f.RDMAHeader, rr[18:]) {
		t.Fatal("TerminateFor aliases its input")
	}
}

// TestRDMAPVersion00 checks that RV 00b (the RDMA Consortium's RDMAP) is
// accepted on receive for the RFC 5040 messages: "Both version numbers are
// valid" (RFC 5040 §4.1). The RFC 7306 messages need 01b (RFC 7306 §4.1,
// TestTerminateCodes).
func TestRDMAPVersion00(t *testing.T) {
	rv0 := func(u []byte) []byte { c := bytes.Clone(u); c[1] &^= 0xC0; return c }
	for _, u := range [][]byte{
		untagged(OpSend, QNSend, 1, 0, []byte("hello")).ulpdu(),
		untagged(OpSendSEInv, QNSend, 1, 0x11223344, []byte("abcd")).ulpdu(),
		untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu(),
		taggedSeg(OpWrite, true, 0x12345678, 0x1000, write12).ulpdu(),
		taggedSeg(OpReadResponse, true, 0xAB01, 0x2000, write12).ulpdu(),
	} {
		want, err := decode(u)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decode(rv0(u))
		if err != nil {
			t.Fatalf("RV 00b %v refused: %v", want.op, err)
		}
		if got.op != want.op || !bytes.Equal(got.body, want.body) {
			t.Fatalf("RV 00b %v decoded as %v", want.op, got.op)
		}
	}
	// A Read Request with RV 00b still has its RDMA header echoed.
	rr := rv0(untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu())
	f := TerminateFor(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtInvalidSTag}, rr, len(rr))
	if !f.R || !bytes.Equal(f.RDMAHeader, rr[ddp.UntaggedHeaderLen:]) {
		t.Fatalf("RV 00b Read Request: R=%v %x", f.R, f.RDMAHeader)
	}
	g, err := ParseTerminate(AppendTerminate(nil, &f))
	if err != nil || !reflect.DeepEqual(g, f) {
		t.Fatalf("round trip %+v %v", g, err)
	}
}
