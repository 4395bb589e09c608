package rdmap

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/rnic-dev/rnic/internal/wiretest"
	"github.com/rnic-dev/rnic/rnic/term"
)

// seedULPDUs returns the ULPDUs of the known-answer vectors.
func seedULPDUs() [][]byte {
	var out [][]byte
	for _, v := range vectors() {
		out = append(out, v.seg.ulpdu())
	}
	return out
}

var causeOf = wiretest.Cause

// FuzzRDMAP runs a whole ULPDU through the receive decoders (DDP header,
// RDMAP control byte, placement, Read Request / Atomic / Immediate /
// Terminate body) and checks the round trips of what is accepted.
func FuzzRDMAP(f *testing.F) {
	for _, u := range seedULPDUs() {
		f.Add(u, true)
	}
	f.Add([]byte{0x41, 0x4C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, ulpdu []byte, atomics bool) {
		if len(ulpdu) == 0 {
			return
		}
		for b := 0; b < 256; b += 37 { // ParseCtrl over a spread of bytes
			x := byte(b) ^ ulpdu[0]
			if op, err := ParseCtrl(x); err == nil && (byte(op) != x&maskOpcode || !ValidVersion(x>>6, op)) {
				t.Fatalf("ParseCtrl(%02x) = %v", x, op)
			}
		}
		d, err := decode(ulpdu)
		if err != nil {
			c := causeOf(t, err)
			switch c.Layer {
			case term.LayerDDP, term.LayerRDMAP:
			default:
				t.Fatalf("cause %v", c)
			}
			return
		}
		if err := CheckPlacement(d.op, d.tagged, d.u.QN, atomics); err == nil && d.op.Atomic() && !atomics {
			t.Fatal("atomic accepted without atomics")
		}
		if d.op.Tagged() != d.tagged || (!d.tagged && d.op.QN() != d.u.QN) {
			t.Fatalf("%v accepted with tagged=%v QN %d", d.op, d.tagged, d.u.QN)
		}
		switch {
		case d.rr != nil:
			if !bytes.Equal(rrBytes(*d.rr), d.body) {
				t.Fatal("Read Request round trip")
			}
		case d.ar != nil:
			enc := arBytes(*d.ar)
			if !bytes.Equal(enc[4:], d.body[4:]) || enc[3] != d.body[3]&0x0F {
				t.Fatal("Atomic Request round trip")
			}
		case d.imm != nil:
			var b [8]byte
			Immediate(b[:]).SetData(*d.imm)
			if !bytes.Equal(b[:], d.body) {
				t.Fatal("Immediate round trip")
			}
		case d.term != nil:
			g, err := ParseTerminate(AppendTerminate(nil, d.term))
			if err != nil || !reflect.DeepEqual(g, *d.term) {
				t.Fatalf("Terminate round trip %+v %v", g, err)
			}
		}
	})
}

// FuzzTerminate feeds arbitrary Terminate headers to ParseTerminate and
// arbitrary offending segments to TerminateFor: every accepted header
// re-encodes to an equivalent header, and TerminateFor's output always
// encodes within 4..52 bytes and parses back to itself.
func FuzzTerminate(f *testing.F) {
	for _, v := range vectors() {
		if v.seg.u.QN == QNTerminate && !v.seg.tagged {
			f.Add(v.seg.body, v.seg.body, uint16(0x0102))
		}
	}
	rr := untagged(OpReadRequest, QNReadRequest, 1, 0, rrBytes(rr11)).ulpdu()
	f.Add([]byte{0x01, 0x09, 0xE0, 0, 0, 0x12, 0x41, 0x44, 0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0}, rr, uint16(0x0100))
	f.Fuzz(func(t *testing.T, hdr, offending []byte, c uint16) {
		if g, err := ParseTerminate(hdr); err == nil {
			b := AppendTerminate(nil, &g)
			g2, err := ParseTerminate(b)
			if err != nil || !reflect.DeepEqual(g, g2) {
				t.Fatalf("re-parse %+v %v", g2, err)
			}
			if len(b) > len(hdr) {
				t.Fatalf("re-encoded %d bytes from %d", len(b), len(hdr))
			}
			if g.D && len(g.DDPHeader) != ddpHeaderLen(g.DDPHeader) || g.RDMAHeader != nil && len(g.RDMAHeader) != ReadRequestLen {
				t.Fatalf("header sizes %d %d", len(g.DDPHeader), len(g.RDMAHeader))
			}
		} else if causeOf(t, err) != (term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnspecified}) {
			t.Fatalf("cause %v", causeOf(t, err))
		}
		cause := term.FromBytes(byte(c>>8)&0x2F, byte(c))
		tf := TerminateFor(cause, offending, len(offending))
		b := AppendTerminate(nil, &tf)
		if len(b) < TerminateMinLen || len(b) > TerminateMaxLen {
			t.Fatalf("Terminate of %d bytes", len(b))
		}
		if n := min(len(offending), len(tf.DDPHeader)); tf.D &&
			(!bytes.Equal(tf.DDPHeader[:n], offending[:n]) || !bytes.Equal(tf.DDPHeader[n:], make([]byte, len(tf.DDPHeader)-n))) {
			t.Fatal("echoed header differs from the offending one (zero-padded)")
		}
		if tf.D && len(tf.DDPHeader) != ddpHeaderLen(offending) {
			t.Fatalf("echoed header of %d bytes", len(tf.DDPHeader))
		}
		if tf.D && len(offending) < len(tf.DDPHeader) && cause.Layer != term.LayerDDP {
			t.Fatalf("partial header echoed for %v", cause)
		}
		if tf.R && (cause.Layer != term.LayerRDMAP || cause.EType != term.RDMARemoteProtection) {
			t.Fatalf("RDMA header echoed for %v", cause)
		}
		g, err := ParseTerminate(b)
		if cause.Layer <= term.LayerLLP && (cause.Layer == term.LayerLLP || cause.EType <= term.DDPUntagged) {
			if err != nil || !reflect.DeepEqual(g, tf) {
				t.Fatalf("TerminateFor round trip %+v\n%+v %v", tf, g, err)
			}
		}
	})
}

// FuzzAtomic decodes Atomic Requests and Responses and checks FetchAdd and
// CmpSwap against the RFC 7306 bit-serial reference and their definitions.
func FuzzAtomic(f *testing.F) {
	for _, v := range vectors() {
		if v.seg.u.RsvdULP0 == Ctrl(OpAtomicRequest) {
			f.Add(v.seg.body)
		}
	}
	f.Add([]byte{0, 0, 0, 1, 0x29, 0, 0, 0, 0, 0, 0, 0})
	f.Add(append(make([]byte, 16), 0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, err := ParseAtomicRequest(b); err == nil {
			fl := a.Fields()
			if fl.AOpcode != AtomicFetchAdd && fl.AOpcode != AtomicCmpSwap {
				t.Fatalf("AOpCode %d accepted", fl.AOpcode)
			}
			enc := arBytes(fl)
			if !bytes.Equal(enc[4:], b[4:]) {
				t.Fatal("Atomic Request round trip")
			}
		} else if c := causeOf(t, err); c.Layer != term.LayerRDMAP || c.EType != term.RDMARemoteOperation {
			t.Fatalf("cause %v", c)
		}
		if r, err := ParseAtomicResponse(b); err == nil {
			fl := r.Fields()
			enc := make(AtomicResponse, AtomicResponseLen)
			enc.Encode(&fl)
			if !bytes.Equal(enc, b) {
				t.Fatal("Atomic Response round trip")
			}
		}
		var w [5]uint64
		for i := range w {
			if len(b) >= 8*(i+1) {
				w[i] = binary.BigEndian.Uint64(b[8*i:])
			}
		}
		orig, x, m, cmp, cm := w[0], w[1], w[2], w[3], w[4]
		if got, want := FetchAdd(orig, x, m), refFetchAdd(orig, x, m); got != want {
			t.Fatalf("FetchAdd(%x, %x, %x) = %x, reference %x", orig, x, m, got, want)
		}
		if FetchAdd(orig, 0, m) != orig || FetchAdd(orig, x, 0) != orig+x {
			t.Fatal("FetchAdd identities")
		}
		got := CmpSwap(orig, x, m, cmp, cm)
		if (orig^cmp)&cm == 0 {
			if got&m != x&m || got&^m != orig&^m {
				t.Fatalf("CmpSwap match: %x", got)
			}
		} else if got != orig {
			t.Fatalf("CmpSwap mismatch changed memory: %x", got)
		}
	})
}
