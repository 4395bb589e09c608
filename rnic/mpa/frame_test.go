package mpa

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
	"testing/iotest"

	"github.com/rnic-dev/rnic/internal/wiretest"
	"github.com/rnic-dev/rnic/rnic/term"
)

var hx = wiretest.Hex

func wantMPA(t testing.TB, err error, code term.Code) {
	t.Helper()
	wiretest.WantCause(t, err, term.LayerLLP, term.LLPMPA, code)
}

// Known-answer MPA Request and Reply frames (RFC 5044 §7.1.1, RFC 6581's
// IRD/ORD block).
var frameVectors = []struct {
	name string
	hex  string
	f    Frame
}{
	{"#1 Request rev 1 CRC", "4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65 40 01 00 00",
		Frame{CRC: true, Rev: 1}},
	{"#2 Reply rev 1 CRC", "4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65 40 01 00 00",
		Frame{Reply: true, CRC: true, Rev: 1}},
	{"#3 Reply reject nope!", "4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65 60 01 00 05 6e 6f 70 65 21",
		Frame{Reply: true, CRC: true, Reject: true, Rev: 1, PrivateData: []byte("nope!")}},
	{"#4 Request rev 2 enhanced", "4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65 50 02 00 04 80 10 40 10",
		Frame{CRC: true, Rev: 2, Enhanced: &IRDORD{IRD: 16, ORD: 16, P2P: true, RTRRead: true}}},
	{"#5 Reply rev 2 enhanced", "4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65 50 02 00 04 80 08 40 10",
		Frame{Reply: true, CRC: true, Rev: 2, Enhanced: &IRDORD{IRD: 8, ORD: 16, P2P: true, RTRRead: true}}},
}

func TestFrameVectors(t *testing.T) {
	for _, v := range frameVectors {
		t.Run(v.name, func(t *testing.T) {
			want := hx(t, v.hex)
			got, err := v.f.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("Append\n got % x\nwant % x", got, want)
			}
			// Parse with trailing FPDU bytes: consumed must stop at the frame.
			f, n, err := ParseFrame(append(append([]byte(nil), want...), 0, 0x16, 0xc1), v.f.Reply)
			if err != nil || n != len(want) {
				t.Fatalf("ParseFrame: n=%d err=%v", n, err)
			}
			if !reflect.DeepEqual(f, v.f) {
				t.Fatalf("ParseFrame %+v, want %+v", f, v.f)
			}
			// ReadFrame leaves the rest of the stream unread, even one byte at a time.
			rest := []byte("FPDU stream")
			r := bytes.NewReader(append(append([]byte(nil), want...), rest...))
			f, err = ReadFrame(iotest.OneByteReader(r), v.f.Reply)
			if err != nil || !reflect.DeepEqual(f, v.f) {
				t.Fatalf("ReadFrame %+v, %v", f, err)
			}
			left, _ := io.ReadAll(r)
			if !bytes.Equal(left, rest) {
				t.Fatalf("ReadFrame consumed stream bytes: left %q", left)
			}
		})
	}
}

// TestFrameNegative: frames a Responder or Initiator must refuse.
func TestFrameNegative(t *testing.T) {
	req := hx(t, frameVectors[0].hex)
	rep := hx(t, frameVectors[1].hex)
	mod := func(b []byte, f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	cases := []struct {
		name  string
		b     []byte
		reply bool
	}{
		{"wrong key Framf", mod(req, func(b []byte) { b[15] = 'f' }), false},
		{"PD_Length 513", append(mod(req, func(b []byte) { b[18], b[19] = 0x02, 0x01 }), make([]byte, 513)...), false},
		{"Reply rev 3", mod(rep, func(b []byte) { b[17] = 3 }), true},
		{"Request rev 0", mod(req, func(b []byte) { b[17] = 0 }), false},
		{"Reply before Request", rep, false},
		{"Request where Reply due", req, true},
		{"enhanced without IRD/ORD room", mod(req, func(b []byte) { b[16], b[17] = 0x50, 2 }), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ParseFrame(c.b, c.reply)
			wantMPA(t, err, term.MPAInvalidFrame)
			_, err = ReadFrame(bytes.NewReader(c.b), c.reply)
			wantMPA(t, err, term.MPAInvalidFrame)
		})
	}
	// Request with M=1: reported, not an error (refusing is the CM's policy).
	f, _, err := ParseFrame(mod(req, func(b []byte) { b[16] |= FlagMarkers }), false)
	if err != nil || !f.Markers {
		t.Fatalf("M=1 Request: %+v %v", f, err)
	}
	// Reserved flags ignored; R ignored in a Request; 0x10 ignored in rev 1.
	f, _, err = ParseFrame(mod(req, func(b []byte) { b[16] |= 0x3F }), false)
	if err != nil || f.Reject || f.Enhanced != nil || !f.CRC {
		t.Fatalf("reserved flags: %+v %v", f, err)
	}
	// Truncation at every length.
	full := hx(t, frameVectors[3].hex)
	for i := range len(full) {
		if _, _, err := ParseFrame(full[:i], false); err != io.ErrUnexpectedEOF {
			t.Fatalf("ParseFrame of %d bytes: %v", i, err)
		}
		_, err := ReadFrame(bytes.NewReader(full[:i]), false)
		want := io.ErrUnexpectedEOF
		if i == 0 {
			want = io.EOF
		}
		if !errors.Is(err, want) {
			t.Fatalf("ReadFrame of %d bytes: %v, want %v", i, err, want)
		}
	}
}

func TestFrameAppendErrors(t *testing.T) {
	bad := []Frame{
		{Rev: 0},
		{Rev: 3},
		{Rev: 1, Enhanced: &IRDORD{}},
		{Rev: 1, Reject: true},
		{Rev: 1, PrivateData: make([]byte, 513)},
		{Rev: 2, Enhanced: &IRDORD{}, PrivateData: make([]byte, 509)},
	}
	for i, f := range bad {
		if b, err := f.Append([]byte{1}); err == nil || len(b) != 1 {
			t.Errorf("case %d: Append gave %d bytes, err %v", i, len(b), err)
		}
	}
	ok := Frame{Rev: 2, Enhanced: &IRDORD{}, PrivateData: make([]byte, 508)}
	b, err := ok.Append(nil)
	if err != nil || len(b) != FrameHeaderLen+MaxPrivateData {
		t.Fatalf("512-byte PD: %d bytes, %v", len(b), err)
	}
	g, _, err := ParseFrame(b, false)
	if err != nil || len(g.PrivateData) != 508 || *g.Enhanced != (IRDORD{}) {
		t.Fatalf("round trip: %+v %v", g, err)
	}
}

func TestIRDORD(t *testing.T) {
	cases := []struct {
		hex string
		p   IRDORD
	}{
		{"80 10 40 10", IRDORD{IRD: 16, ORD: 16, P2P: true, RTRRead: true}},
		{"80 08 40 10", IRDORD{IRD: 8, ORD: 16, P2P: true, RTRRead: true}},
		{"00 00 00 00", IRDORD{}},
		{"ff ff ff ff", IRDORD{IRD: MaxIRDORD, ORD: MaxIRDORD, P2P: true, RTRSend: true, RTRWrite: true, RTRRead: true}},
		{"40 01 80 02", IRDORD{IRD: 1, ORD: 2, RTRSend: true, RTRWrite: true}},
	}
	for _, c := range cases {
		b := hx(t, c.hex)
		p, err := ParseIRDORD(b)
		if err != nil || p != c.p {
			t.Fatalf("%s: %+v %v", c.hex, p, err)
		}
		var out [4]byte
		c.p.Put(out[:])
		if !bytes.Equal(out[:], b) {
			t.Fatalf("Put %+v = % x, want %s", c.p, out, c.hex)
		}
	}
	_, err := ParseIRDORD([]byte{1, 2, 3})
	wantMPA(t, err, term.MPAInvalidFrame)
	var out [4]byte
	IRDORD{IRD: 0xFFFF, ORD: 0x4000}.Put(out[:])
	if p, _ := ParseIRDORD(out[:]); p.IRD != MaxIRDORD || p.ORD != MaxIRDORD || p.P2P || p.RTRWrite {
		t.Fatalf("oversized IRD/ORD not clamped: %+v", p)
	}
}
