package mpa

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// writePieces frames u into w as the engine does: the first MinULPDU bytes
// as the header, the rest as payload pieces of random sizes.
func writePieces(rng *rand.Rand, w *Writer, u []byte) {
	hdr, payload := u[:MinULPDU], u[MinULPDU:]
	w.Begin(hdr, len(payload))
	for len(payload) > 0 {
		k := 1 + rng.IntN(len(payload))
		w.Payload(payload[:k])
		payload = payload[k:]
	}
	w.End()
}

// A batch of FPDUs built piece by piece is byte for byte the FPDUs framed
// whole, and a Reader reads the ULPDUs back with their CRCs verified.
func TestWriterBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, crc := range []bool{true, false} {
		for _, size := range []int{0, 100, 64 << 10} {
			us := ulpdus(rng, 50, 3000)
			w := NewWriter(size, crc)
			for _, u := range us {
				writePieces(rng, w, u)
			}
			want := plainStream(us, crc)
			if !bytes.Equal(w.Bytes(), want) || w.Len() != len(want) {
				t.Fatalf("crc %v size %d: batch of %d bytes differs from the %d framed whole", crc, size, w.Len(), len(want))
			}
			got, err := readAll(NewReader(bytes.NewReader(w.Bytes()), ReaderConfig{CRC: crc}))
			if err != io.EOF {
				t.Fatalf("reading the batch back: %v", err)
			}
			sameULPDUs(t, got, us)
			w.Reset()
			if w.Len() != 0 || w.Available() < len(want) {
				t.Fatalf("after Reset: len %d, available %d", w.Len(), w.Available())
			}
		}
	}
}

// Abandon, and Begin over an FPDU not ended, leave the batch as it was.
func TestWriterAbandon(t *testing.T) {
	w := NewWriter(256, true)
	w.Append(make([]byte, 18), []byte("kept"))
	before := bytes.Clone(w.Bytes())
	w.Begin(make([]byte, 14), 10)
	w.Payload([]byte("half"))
	w.Abandon()
	w.Abandon() // nothing begun: no effect
	if !bytes.Equal(w.Bytes(), before) {
		t.Fatalf("after Abandon % x, want % x", w.Bytes(), before)
	}
	w.Begin(make([]byte, 14), 10)
	w.Payload([]byte("dropped"))
	w.Append(make([]byte, 18), []byte("next"))
	want := AppendFPDU(before, make([]byte, 18), []byte("next"), true)
	if !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("Begin over an open FPDU: % x, want % x", w.Bytes(), want)
	}
}

// Fits tells when Begin grows the batch; growing keeps what is in it.
func TestWriterFitsAndGrows(t *testing.T) {
	w := NewWriter(FPDULen(20), true)
	if !w.Fits(22) || w.Fits(23) { // FPDULen: 28 and 32
		t.Fatalf("Fits(22) %v Fits(23) %v with %d available", w.Fits(22), w.Fits(23), w.Available())
	}
	w.Append(make([]byte, 14), []byte("123456"))
	if w.Available() != 0 || w.Fits(MinULPDU) {
		t.Fatalf("full batch: available %d", w.Available())
	}
	first := bytes.Clone(w.Bytes())
	w.Append(make([]byte, 14), make([]byte, 1000))
	if !bytes.Equal(w.Bytes()[:len(first)], first) || w.Len() != len(first)+FPDULen(1014) {
		t.Fatalf("grown batch of %d bytes lost its first FPDU", w.Len())
	}
}

// Misuse panics rather than framing a wrong length: more payload than
// declared, End with payload missing, Payload or End outside an FPDU, a
// ULPDU over 65535 bytes.
func TestWriterMisuse(t *testing.T) {
	cases := map[string]func(w *Writer){
		"payload past n": func(w *Writer) { w.Begin(make([]byte, 14), 2); w.Payload([]byte("abc")) },
		"end short":      func(w *Writer) { w.Begin(make([]byte, 14), 2); w.Payload([]byte("a")); w.End() },
		"payload idle":   func(w *Writer) { w.Payload([]byte("a")) },
		"end idle":       func(w *Writer) { w.End() },
		"too long":       func(w *Writer) { w.Begin(make([]byte, 18), MaxULPDU-17) },
		"negative":       func(w *Writer) { w.Begin(make([]byte, 18), -1) },
	}
	for name, f := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f(NewWriter(1<<10, true))
		}()
	}
}

// Framing into a batch with room allocates nothing.
func TestWriterNoAllocs(t *testing.T) {
	w := NewWriter(64<<10, true)
	hdr, payload := make([]byte, 18), make([]byte, 4000)
	allocs := testing.AllocsPerRun(100, func() {
		w.Reset()
		for range 8 {
			w.Begin(hdr, len(payload))
			w.Payload(payload[:1000])
			w.Payload(payload[1000:])
			w.End()
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch", allocs)
	}
}
