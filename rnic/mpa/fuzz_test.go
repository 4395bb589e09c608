package mpa

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"testing/iotest"

	"github.com/rnic-dev/rnic/rnic/term"
)

// fpduSeeds are known-answer FPDU streams (TestAppendFPDU has the first).
var fpduSeeds = []string{
	"00 17 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 68 65 6c 6c 6f 00 00 00 b9 90 b1 0c",
	"00 16 c1 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 04 05 06 07 ea ef b4 f7" +
		"00 12 81 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 53 bc f2 9d",
	"00 0e c1 40 12 34 56 78 00 00 00 00 00 00 10 00 c5 99 e9 a9",
	"00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00 00 00 ab 01 00 00 00 00 00 00 20 00" +
		"00 00 10 00 12 34 56 78 00 00 00 00 00 00 10 00 36 f3 9c 87",
	"00 16 41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00 20 02 00 00 7f e4 25 85",
}

// FuzzReader feeds arbitrary streams to the FPDU Reader under every
// configuration. It must never panic or loop, must report only the
// documented errors, and every FPDU it accepts, framed again by
// AppendFPDU, must read back to the same ULPDU.
func FuzzReader(f *testing.F) {
	for i, s := range fpduSeeds {
		f.Add(hx(f, s), uint8(i))
	}
	var w markerWriter
	w.fpdu(make([]byte, 600), true)
	w.fpdu([]byte("0123456789abcdefgh"), true)
	f.Add(w.out, uint8(0x06))
	f.Fuzz(func(t *testing.T, stream []byte, mode uint8) {
		cfg := ReaderConfig{CRC: mode&1 != 0, Markers: mode&2 != 0, MaxULPDU: int(mode>>4) * 300, BufSize: 64 + int(mode>>2&3)*100}
		var src io.Reader = bytes.NewReader(stream)
		if mode&0x08 != 0 {
			src = iotest.OneByteReader(src)
		}
		r := NewReader(src, cfg)
		got, err := fuzzRead(t, r, stream)
		// The same stream from a vectored source (direct placement) reads
		// the same, to the same error.
		vgot, verr := fuzzRead(t, NewReader(&vecReader{chunkReader: chunkReader{b: stream, sizes: []int{5000, 3, 70000, 1}}}, cfg), stream)
		if !reflect.DeepEqual(vgot, got) || fmt.Sprint(verr) != fmt.Sprint(err) {
			t.Fatalf("vectored source: %d FPDUs, %v; plain: %d, %v", len(vgot), verr, len(got), err)
		}
		// And from a source that often has nothing, read with ReadSome
		// (the receive's placement under a region's lock).
		nw := &nowaitVec{vecReader: vecReader{chunkReader: chunkReader{b: stream, sizes: []int{5000, 3, 70000, 1}}}}
		sgot, serr := fuzzReadWith(t, NewReader(nw, cfg), stream, true)
		if !reflect.DeepEqual(sgot, got) || fmt.Sprint(serr) != fmt.Sprint(err) {
			t.Fatalf("ReadSome: %d FPDUs, %v; ReadFull: %d, %v", len(sgot), serr, len(got), err)
		}
		var te *term.Error
		switch {
		case err == io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
		case errors.As(err, &te):
			if te.Cause.Layer != term.LayerLLP || (te.Cause.Code != term.MPACRC && te.Cause.Code != term.MPAMarker) {
				t.Fatalf("unexpected cause %v", te.Cause)
			}
			if te.Cause.Code == term.MPACRC && !cfg.CRC {
				t.Fatal("CRC error with CRCs off")
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
		if _, err2 := r.Next(); err2 != err {
			t.Fatalf("error not sticky: %v then %v", err, err2)
		}
		// Round trip what was accepted (padded back to its length where it was
		// half discarded).
		var again []byte
		for _, u := range got {
			u = append(u, make([]byte, max(0, MinULPDU-len(u)))...)
			again = AppendFPDU(again, u, nil, true)
		}
		back, err := readAll(NewReader(bytes.NewReader(again), ReaderConfig{CRC: true}))
		if err != io.EOF || len(back) != len(got) {
			t.Fatalf("round trip: %d of %d FPDUs, %v", len(back), len(got), err)
		}
	})
}

// fuzzRead reads r's FPDUs as FuzzReader does: half of each ULPDU with
// ReadFull, the rest read or discarded in turn.
func fuzzRead(t *testing.T, r *Reader, stream []byte) ([][]byte, error) {
	return fuzzReadWith(t, r, stream, false)
}

// fuzzReadWith is fuzzRead, reading the first half of each ULPDU with
// ReadSome when some is set.
func fuzzReadWith(t *testing.T, r *Reader, stream []byte, some bool) ([][]byte, error) {
	var got [][]byte
	var err error
	for i := 0; ; i++ {
		if i > len(stream) {
			t.Fatal("more FPDUs than bytes")
		}
		var n int
		if n, err = r.Next(); err != nil {
			break
		}
		if n < MinULPDU || n > r.cfg.MaxULPDU || r.Remaining() != n {
			t.Fatalf("ULPDU_LENGTH %d accepted", n)
		}
		u := make([]byte, n)
		half := n / 2
		if some {
			var blocked int
			err = readSome(t, r, u[:half], &blocked)
		} else {
			err = r.ReadFull(u[:half])
		}
		if err != nil {
			break
		}
		if i%2 == 0 {
			err = r.ReadFull(u[half:])
		} else {
			err = r.Discard(n - half)
			u = u[:half]
		}
		if err != nil {
			break
		}
		if err = r.Finish(); err != nil {
			break
		}
		got = append(got, u)
	}
	return got, err
}

// FuzzParseFrame checks that ParseFrame never panics, that ReadFrame agrees
// with it, and that accepted frames survive Append/Parse.
func FuzzParseFrame(f *testing.F) {
	for _, v := range frameVectors {
		f.Add(hx(f, v.hex), v.f.Reply)
	}
	f.Add(append(hx(f, "4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65 d0 02 00 09 c0 01 80 05"), "hello"...), false)
	f.Fuzz(func(t *testing.T, b []byte, reply bool) {
		fr, n, err := ParseFrame(b, reply)
		rf, rerr := ReadFrame(bytes.NewReader(b), reply)
		if err != nil {
			var te *term.Error
			if errors.As(err, &te) {
				if te.Cause != (term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPAInvalidFrame}) {
					t.Fatalf("cause %v", te.Cause)
				}
			} else if err != io.ErrUnexpectedEOF {
				t.Fatalf("error %v", err)
			}
			if rerr == nil {
				t.Fatalf("ReadFrame accepted what ParseFrame refused: %v", err)
			}
			return
		}
		if rerr != nil || !reflect.DeepEqual(fr, rf) {
			t.Fatalf("ReadFrame %+v %v, ParseFrame %+v", rf, rerr, fr)
		}
		if n > len(b) || n < FrameHeaderLen || fr.Reply != reply {
			t.Fatalf("n=%d", n)
		}
		enc, err := fr.Append(nil)
		if err != nil {
			t.Fatalf("Append of a parsed frame: %v", err)
		}
		if len(enc) != n || !bytes.Equal(enc[:16], b[:16]) || !bytes.Equal(enc[17:], b[17:n]) {
			t.Fatalf("re-encoded % x, was % x", enc, b[:n])
		}
		again, m, err := ParseFrame(enc, reply)
		if err != nil || m != n || !reflect.DeepEqual(again, fr) {
			t.Fatalf("round trip %+v %v", again, err)
		}
	})
}

// FuzzParseIRDORD: every 4-byte block decodes, and Put gives the same bytes.
func FuzzParseIRDORD(f *testing.F) {
	for _, s := range []string{"80 10 40 10", "80 08 40 10", "00 00 00 00", "ff ff ff ff", "40 01 80 02", "01"} {
		f.Add(hx(f, s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseIRDORD(b)
		if len(b) < IRDORDLen {
			if err == nil {
				t.Fatal("short block accepted")
			}
			return
		}
		if err != nil || p.IRD > MaxIRDORD || p.ORD > MaxIRDORD {
			t.Fatalf("%+v %v", p, err)
		}
		var out [IRDORDLen]byte
		p.Put(out[:])
		if !bytes.Equal(out[:], b[:IRDORDLen]) {
			t.Fatalf("Put % x, parsed from % x", out, b[:IRDORDLen])
		}
	})
}
