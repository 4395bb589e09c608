package mpa

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"

	"github.com/rnic-dev/rnic/rnic/term"
)

// ulpdus returns n random ULPDUs of sizes in [MinULPDU, max].
func ulpdus(rng *rand.Rand, n, max int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, MinULPDU+rng.IntN(max-MinULPDU+1))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		out[i] = b
	}
	return out
}

// plainStream frames ULPDUs without markers.
func plainStream(us [][]byte, crc bool) []byte {
	var s []byte
	for _, u := range us {
		s = AppendFPDU(s, u[:MinULPDU], u[MinULPDU:], crc)
	}
	return s
}

// markerWriter frames ULPDUs with markers, from the marker rules alone
// (RFC 5044 §4): a marker at every stream offset that is a multiple of 512 (the
// first at offset 0), FPDUPTR = marker offset - offset of the FPDU's first
// byte (0 when the FPDU begins with it), markers inside an FPDU covered by
// its CRC, and a marker due where the CRC would start placed before it.
type markerWriter struct {
	out       []byte
	fpduStart int
	leadPtr   bool // count FPDUPTR from the ULPDU_LENGTH after a leading marker
}

func (w *markerWriter) put(b []byte) {
	for _, c := range b {
		w.markerIfDue()
		w.out = append(w.out, c)
	}
}

func (w *markerWriter) markerIfDue() {
	if len(w.out)%MarkerInterval != 0 {
		return
	}
	ptr := len(w.out) - w.fpduStart
	if w.leadPtr && ptr > 0 && w.fpduStart%MarkerInterval == 0 {
		ptr -= MarkerLen
	}
	w.out = binary.BigEndian.AppendUint16(w.out, 0)
	w.out = binary.BigEndian.AppendUint16(w.out, uint16(ptr))
}

func (w *markerWriter) fpdu(ulpdu []byte, crc bool) {
	w.fpduStart = len(w.out)
	var l [2]byte
	binary.BigEndian.PutUint16(l[:], uint16(len(ulpdu)))
	w.put(l[:])
	w.put(ulpdu)
	w.put(make([]byte, PadLen(len(ulpdu))))
	w.markerIfDue()
	var c [4]byte
	if crc {
		binary.LittleEndian.PutUint32(c[:], crc32.Checksum(w.out[w.fpduStart:], castagnoli))
	}
	w.out = append(w.out, c[:]...) // 4-aligned: no marker can fall inside
}

// readAll reads every FPDU of r, cutting each ULPDU into ReadFull calls of
// the given sizes (cycled), and returns the ULPDUs and the final error.
func readAll(r *Reader, chunks ...int) ([][]byte, error) {
	var out [][]byte
	for {
		n, err := r.Next()
		if err != nil {
			return out, err
		}
		u := make([]byte, n)
		for off, i := 0, 0; off < n; i++ {
			k := n - off
			if len(chunks) > 0 {
				k = min(k, chunks[i%len(chunks)])
			}
			if err := r.ReadFull(u[off : off+k]); err != nil {
				return out, err
			}
			off += k
			if r.Remaining() != n-off {
				return out, errors.New("Remaining out of step")
			}
		}
		if err := r.Finish(); err != nil {
			return out, err
		}
		out = append(out, u)
	}
}

func sameULPDUs(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d ULPDUs, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("ULPDU %d differs", i)
		}
	}
}

// chunkReader returns the stream in reads of the given sizes (cycled).
type chunkReader struct {
	b     []byte
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), c.sizes[c.i%len(c.sizes)])
	c.i++
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// vecReader is a VecReader over the stream of its chunkReader: each call
// returns at most the next size (cycled) of bytes, filling a before b, and
// no call returns bytes from both sides of a stream offset in stops (as a
// socket holds only the batches the sender has written). It counts the
// bytes it placed in a.
type vecReader struct {
	chunkReader
	stops  []int
	pos    int
	direct int
	calls  int
}

func (v *vecReader) ReadVec(a, b []byte) (int, error) {
	if len(v.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(a)+len(b), len(v.b), v.sizes[v.i%len(v.sizes)])
	for len(v.stops) > 0 && v.stops[0] <= v.pos {
		v.stops = v.stops[1:]
	}
	if len(v.stops) > 0 {
		n = min(n, v.stops[0]-v.pos)
	}
	v.i++
	v.calls++
	k := copy(a, v.b[:n])
	copy(b, v.b[k:n])
	v.b = v.b[n:]
	v.pos += n
	v.direct += k
	return n, nil
}

func (v *vecReader) Read(p []byte) (int, error) {
	n, err := v.ReadVec(p, nil)
	v.direct -= n // into the Reader's buffer
	return n, err
}

func TestReaderStreams(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	us := ulpdus(rng, 40, 3000)
	us = append(us, make([]byte, MinULPDU), make([]byte, 9000), make([]byte, MaxULPDU))
	for _, crc := range []bool{true, false} {
		s := plainStream(us, crc)
		readers := map[string]func() io.Reader{
			"whole":   func() io.Reader { return bytes.NewReader(s) },
			"onebyte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(s)) },
			"half":    func() io.Reader { return iotest.HalfReader(bytes.NewReader(s)) },
			"dataerr": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(s)) },
			"chunks":  func() io.Reader { return &chunkReader{b: s, sizes: []int{1, 7, 300, 2, 4096, 65536, 3}} },
			"vec":     func() io.Reader { return &vecReader{chunkReader: chunkReader{b: s, sizes: []int{1 << 30}}} },
			"vecchunks": func() io.Reader {
				return &vecReader{chunkReader: chunkReader{b: s, sizes: []int{1, 7, 300, 2, 4096, 65536, 3}}}
			},
			"smallbuf": func() io.Reader { return bytes.NewReader(s) },
		}
		for name, mk := range readers {
			cfg := ReaderConfig{CRC: crc}
			if name == "smallbuf" {
				cfg.BufSize = 70
			}
			for _, chunks := range [][]int{nil, {1}, {5, 13, 5000}} {
				got, err := readAll(NewReader(mk(), cfg), chunks...)
				if err != io.EOF {
					t.Fatalf("crc=%v %s chunks %v: %v", crc, name, chunks, err)
				}
				sameULPDUs(t, got, us)
			}
		}
	}
}

// A stream of large FPDUs from a vectored source is placed straight into
// the caller's slices, not through the buffer; small FPDUs between them
// still come in large reads. A corrupted byte of a directly placed payload
// is still a CRC error.
func TestReaderDirectPlacement(t *testing.T) {
	var us [][]byte
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range 24 {
		n := 60000
		if i%8 == 7 {
			n = 100 // a small one between the large
		}
		u := make([]byte, n)
		for j := range u {
			u[j] = byte(rng.Uint32())
		}
		us = append(us, u)
	}
	s := plainStream(us, true)
	var large int
	var batches []int // the sender's writes: four FPDUs each
	for i, off := 0, 0; i < len(us); i++ {
		if len(us[i]) > 100 {
			large += len(us[i])
		}
		off += FPDULen(len(us[i]))
		if i%4 == 3 {
			batches = append(batches, off)
		}
	}
	for _, sizes := range [][]int{{1 << 30}, {256 << 10}, {70000, 30000, 513}} {
		src := &vecReader{chunkReader: chunkReader{b: s, sizes: sizes}, stops: batches}
		got, err := readAll(NewReader(src, ReaderConfig{CRC: true, BufSize: 256 << 10}))
		if err != io.EOF {
			t.Fatalf("reads of %v: %v", sizes, err)
		}
		sameULPDUs(t, got, us)
		// All but the first buffer's worth and the bytes read with the
		// headers of the next FPDU.
		if src.direct < large*3/4 {
			t.Fatalf("reads of %v: %d of %d large-payload bytes placed directly", sizes, src.direct, large)
		}
	}
	// A burst of small FPDUs after the stream comes in large reads again.
	burst := make([][]byte, 64)
	for i := range burst {
		burst[i] = make([]byte, 4100)
	}
	src := &vecReader{chunkReader: chunkReader{b: plainStream(append(us[:4:4], burst...), true), sizes: []int{1 << 30}},
		stops: []int{4 * FPDULen(60000)}}
	r := NewReader(src, ReaderConfig{CRC: true, BufSize: 256 << 10})
	for range 6 { // the large FPDUs and two small ones
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	before := src.calls
	got, err := readAll(r)
	if err != io.EOF || len(got) != len(burst)-2 {
		t.Fatalf("burst: %d FPDUs, %v", len(got), err)
	}
	if calls := src.calls - before; calls > 4 {
		t.Fatalf("%d reads for a burst of %d small FPDUs", calls, len(got))
	}
	for i := 3 * FPDULen(60000) / 2; i < len(s); i += 7919 {
		bad := append([]byte(nil), s...)
		bad[i] ^= 0x40
		_, err := readAll(NewReader(&vecReader{chunkReader: chunkReader{b: bad, sizes: []int{1 << 30}}}, ReaderConfig{CRC: true}))
		var te *term.Error
		if !errors.As(err, &te) || te.Cause.Layer != term.LayerLLP {
			t.Fatalf("byte %d corrupted: %v", i, err)
		}
	}
}

// Several FPDUs in one read, and every split of a stream into two reads.
func TestReaderSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	us := ulpdus(rng, 4, 40)
	s := plainStream(us, true)
	for cut := 0; cut <= len(s); cut++ {
		r := NewReader(io.MultiReader(bytes.NewReader(s[:cut]), bytes.NewReader(s[cut:])), ReaderConfig{CRC: true, BufSize: 64})
		got, err := readAll(r, 3)
		if err != io.EOF {
			t.Fatalf("cut %d: %v", cut, err)
		}
		sameULPDUs(t, got, us)
	}
}

func TestReaderDiscard(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	us := ulpdus(rng, 30, 20000)
	r := NewReader(&chunkReader{b: plainStream(us, true), sizes: []int{999}}, ReaderConfig{CRC: true})
	for i, u := range us {
		n, err := r.Next()
		if err != nil || n != len(u) {
			t.Fatalf("FPDU %d: %d %v", i, n, err)
		}
		h := make([]byte, MinULPDU)
		if err := r.ReadFull(h); err != nil || !bytes.Equal(h, u[:MinULPDU]) {
			t.Fatalf("header %d: %v", i, err)
		}
		switch i % 3 {
		case 0:
			if err := r.Discard(r.Remaining()); err != nil {
				t.Fatal(err)
			}
		case 1:
			if err := r.Discard(r.Remaining() / 2); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.ReadFull(make([]byte, r.Remaining()+1)); err == nil {
			t.Fatal("read past the ULPDU allowed")
		}
		if err := r.Finish(); err != nil { // Finish discards the rest
			t.Fatalf("FPDU %d: %v", i, err)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// A corrupted byte anywhere in an FPDU: CRC error (or lost framing when the
// length field itself is hit); with CRCs off, a corrupted trailer passes.
func TestReaderBadCRC(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	us := ulpdus(rng, 3, 100)
	s := plainStream(us, true)
	first := FPDULen(len(us[0]))
	for i := range s {
		bad := append([]byte(nil), s...)
		bad[i] ^= 0x20
		_, err := readAll(NewReader(bytes.NewReader(bad), ReaderConfig{CRC: true}))
		var te *term.Error
		if !errors.As(err, &te) || te.Cause.Layer != term.LayerLLP ||
			(te.Cause.Code != term.MPACRC && te.Cause.Code != term.MPAMarker && err != io.ErrUnexpectedEOF) {
			if !(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)) {
				t.Fatalf("byte %d: %v", i, err)
			}
		}
		if i >= 2 && i < first { // not the length: must be a CRC error on FPDU 0
			if !errors.As(err, &te) || te.Cause.Code != term.MPACRC {
				t.Fatalf("byte %d: %v, want CRC error", i, err)
			}
		}
	}
	// Sticky.
	bad := append([]byte(nil), s...)
	bad[first-1] ^= 1
	r := NewReader(bytes.NewReader(bad), ReaderConfig{CRC: true})
	_, err := readAll(r)
	wantMPA(t, err, term.MPACRC)
	if _, err2 := r.Next(); err2 != err {
		t.Fatalf("not sticky: %v", err2)
	}
	// CRC off: trailers are not checked.
	for i := 0; i < len(s); {
		n := int(binary.BigEndian.Uint16(s[i:]))
		f := FPDULen(n)
		copy(bad[i+f-4:], "JUNK")
		i += f
	}
	got, err := readAll(NewReader(bytes.NewReader(bad), ReaderConfig{}))
	if err != io.EOF {
		t.Fatal(err)
	}
	sameULPDUs(t, got, us)
}

func TestReaderLength(t *testing.T) {
	short := AppendFPDU(nil, make([]byte, 13), nil, true)
	_, err := NewReader(bytes.NewReader(short), ReaderConfig{CRC: true}).Next()
	wantMPA(t, err, term.MPAMarker)
	long := AppendFPDU(nil, make([]byte, 101), nil, true)
	_, err = NewReader(bytes.NewReader(long), ReaderConfig{CRC: true, MaxULPDU: 100}).Next()
	wantMPA(t, err, term.MPAMarker)
	if n, err := NewReader(bytes.NewReader(long), ReaderConfig{CRC: true, MaxULPDU: 101}).Next(); n != 101 || err != nil {
		t.Fatalf("%d %v", n, err)
	}
}

func TestReaderTruncated(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	us := ulpdus(rng, 3, 60)
	s := plainStream(us, true)
	bounds := map[int]bool{0: true}
	for i, off := 0, 0; i < len(us); i++ {
		off += FPDULen(len(us[i]))
		bounds[off] = true
	}
	for cut := 0; cut < len(s); cut++ {
		_, err := readAll(NewReader(iotest.OneByteReader(bytes.NewReader(s[:cut])), ReaderConfig{CRC: true}), 4)
		want := io.ErrUnexpectedEOF
		if bounds[cut] {
			want = io.EOF
		}
		if err != want {
			t.Fatalf("cut %d: %v, want %v", cut, err, want)
		}
	}
	// Other I/O errors are passed up wrapped.
	boom := errors.New("boom")
	_, err := readAll(NewReader(iotest.ErrReader(boom), ReaderConfig{}))
	if !errors.Is(err, boom) {
		t.Fatalf("%v", err)
	}
	_, err = readAll(NewReader(io.MultiReader(bytes.NewReader(s[:30]), iotest.ErrReader(boom)), ReaderConfig{}))
	if !errors.Is(err, boom) {
		t.Fatalf("%v", err)
	}
}

func TestReaderMarkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	// Sizes chosen so markers fall at FPDU starts, inside headers and
	// payloads, between pad and CRC, and several times in one FPDU.
	var us [][]byte
	for _, n := range []int{502, 14, 486, 1000, 2044, 17, 15, 3000, 506, 503, 504, 505} {
		u := make([]byte, n)
		for i := range u {
			u[i] = byte(rng.Uint32())
		}
		us = append(us, u)
	}
	us = append(us, ulpdus(rng, 200, 1500)...)
	for _, leadPtr := range []bool{false, true} {
		for _, crc := range []bool{true, false} {
			w := &markerWriter{leadPtr: leadPtr}
			var lead, beforeCRC int
			for _, u := range us {
				if len(w.out)%MarkerInterval == 0 {
					lead++
				}
				w.fpdu(u, crc)
				if (len(w.out)-8)%MarkerInterval == 0 {
					beforeCRC++
				}
			}
			if lead < 2 || beforeCRC < 1 {
				t.Fatalf("test stream lacks corner cases: %d leading, %d before CRC", lead, beforeCRC)
			}
			for _, mk := range []func() io.Reader{
				func() io.Reader { return bytes.NewReader(w.out) },
				func() io.Reader { return iotest.OneByteReader(bytes.NewReader(w.out)) },
				func() io.Reader { return &chunkReader{b: w.out, sizes: []int{509, 3, 1, 8192}} },
			} {
				got, err := readAll(NewReader(mk(), ReaderConfig{CRC: crc, Markers: true, BufSize: 600}), 7, 5000)
				if err != io.EOF {
					t.Fatalf("leadPtr=%v crc=%v: %v", leadPtr, crc, err)
				}
				sameULPDUs(t, got, us)
			}
			// Markers are covered by the CRC: flipping a marker's reserved bits
			// (not checked themselves) breaks it.
			if crc {
				bad := append([]byte(nil), w.out...)
				bad[MarkerInterval*3] ^= 0x80
				_, err := readAll(NewReader(bytes.NewReader(bad), ReaderConfig{CRC: true, Markers: true}))
				wantMPA(t, err, term.MPACRC)
			}
			// A wrong FPDUPTR is a marker error.
			bad := append([]byte(nil), w.out...)
			bad[MarkerInterval*5+3] ^= 0x04
			_, err := readAll(NewReader(bytes.NewReader(bad), ReaderConfig{CRC: crc, Markers: true}))
			wantMPA(t, err, term.MPAMarker)
		}
	}
}

func TestReaderMisuse(t *testing.T) {
	s := plainStream([][]byte{make([]byte, 20), make([]byte, 30)}, true)
	r := NewReader(bytes.NewReader(s), ReaderConfig{CRC: true})
	if err := r.ReadFull(make([]byte, 1)); err == nil {
		t.Fatal("ReadFull before Next")
	}
	if err := r.Finish(); err != nil {
		t.Fatal("Finish outside an FPDU:", err)
	}
	if n, _ := r.Next(); n != 20 {
		t.Fatal(n)
	}
	if err := r.Discard(-1); err == nil {
		t.Fatal("negative Discard")
	}
	// Next without Finish finishes the FPDU.
	if n, err := r.Next(); n != 30 || err != nil {
		t.Fatal(n, err)
	}
	if r.Buffered() != 0+FPDULen(30)-2 {
		t.Fatalf("Buffered %d", r.Buffered())
	}
}

func TestReaderNoAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	s := plainStream(ulpdus(rng, 1, 8000), true)
	src := bytes.NewReader(s)
	r := NewReader(src, ReaderConfig{CRC: true})
	buf := make([]byte, MaxULPDU)
	n := testing.AllocsPerRun(200, func() {
		src.Reset(s)
		r.Reset(src)
		n, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ReadFull(buf[:n]); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per FPDU", n)
	}
}

func BenchmarkReader(b *testing.B) {
	for _, size := range []int{64, 4096, 9000} {
		rng := rand.New(rand.NewPCG(1, uint64(size)))
		us := ulpdus(rng, 64, size)
		for i := range us {
			us[i] = us[i][:cap(us[i])]
			us[i] = append(us[i], make([]byte, size-len(us[i]))...)
		}
		s := plainStream(us, true)
		buf := make([]byte, size)
		b.Run(fmt.Sprintf("ulpdu=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			src := bytes.NewReader(s)
			r := NewReader(src, ReaderConfig{CRC: true})
			for b.Loop() {
				src.Reset(s)
				r.Reset(src)
				for {
					n, err := r.Next()
					if err != nil {
						break
					}
					_ = r.ReadFull(buf[:n])
					if err := r.Finish(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// blockingSource returns ErrWouldBlock at the points listed (read call
// numbers), the stream otherwise, a few bytes at a time.
type blockingSource struct {
	b     []byte
	r     *Reader
	calls int
	at    map[int]bool
	step  int
}

func (s *blockingSource) Read(p []byte) (int, error) {
	s.calls++
	if s.at[s.calls] {
		return 0, ErrWouldBlock
	}
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.step)], s.b)
	s.b = s.b[n:]
	return n, nil
}

// readOne reads the next FPDU's ULPDU whole.
func readOne(t *testing.T, r *Reader) []byte {
	t.Helper()
	n, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	u := make([]byte, n)
	if err := r.ReadFull(u); err != nil {
		t.Fatal(err)
	}
	if err := r.Finish(); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestReaderWouldBlock: a source's ErrWouldBlock at an FPDU boundary
// (Idle) makes Next return it with nothing changed, and the stream reads
// on afterwards; anywhere else it is a read error that sticks.
func TestReaderWouldBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	us := ulpdus(rng, 20, 300)
	stream := plainStream(us, true)
	t.Run("at boundaries", func(t *testing.T) {
		src := &blockingSource{b: stream, step: len(stream)}
		r := NewReader(src, ReaderConfig{CRC: true, BufSize: 64})
		var got [][]byte
		blocked := 0
		for len(got) < len(us) {
			if !r.Idle() {
				t.Fatalf("not idle before FPDU %d", len(got))
			}
			src.at = map[int]bool{src.calls + 1: true}
			if n, err := r.Next(); err != ErrWouldBlock || n != 0 {
				t.Fatalf("Next with the source blocking: %d, %v", n, err)
			}
			blocked++
			if !r.Idle() {
				t.Fatal("ErrWouldBlock changed the Reader's state")
			}
			got = append(got, readOne(t, r))
			// Drain what the buffer holds so that the next Next reads.
			for !r.Idle() && len(got) < len(us) {
				got = append(got, readOne(t, r))
			}
		}
		sameULPDUs(t, got, us)
		if blocked == 0 {
			t.Fatal("the source never blocked")
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("end of stream: %v", err)
		}
	})
	// ReadSome too: the source is no NoWaitReader, so ReadSome reads as
	// ReadFull does, and its ErrWouldBlock inside an FPDU is a read error.
	for name, read := range map[string]func(r *Reader, p []byte) error{
		"ReadFull": (*Reader).ReadFull,
		"ReadSome": func(r *Reader, p []byte) error { _, err := r.ReadSome(p); return err },
	} {
		t.Run("inside an FPDU, "+name, func(t *testing.T) {
			// Three bytes per read: the second read is inside the first
			// FPDU's ULPDU.
			src := &blockingSource{b: stream, step: 3, at: map[int]bool{2: true}}
			r := NewReader(src, ReaderConfig{CRC: true, BufSize: 64})
			n, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if err := read(r, make([]byte, n)); !errors.Is(err, ErrWouldBlock) || err == ErrWouldBlock {
				t.Fatalf("ErrWouldBlock inside an FPDU: %v, want a read error wrapping it", err)
			}
			if _, err := r.Next(); err == nil {
				t.Fatal("the error did not stick")
			}
		})
	}
}

// idleBlockingSource serves a stream step bytes at a time and, as the
// contract of ErrWouldBlock allows, returns ErrWouldBlock once each time
// the Reader is Idle when it is read (as the rnic receive does when a
// waiter's CQ holds a completion, or when a waiter asked for the receive
// and the socket is empty).
type idleBlockingSource struct {
	b       []byte
	r       *Reader
	step    int
	blocked bool
	blocks  int
}

func (s *idleBlockingSource) Read(p []byte) (int, error) {
	if s.r.Idle() && !s.blocked {
		s.blocked = true
		s.blocks++
		return 0, ErrWouldBlock
	}
	s.blocked = false
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.step)], s.b)
	s.b = s.b[n:]
	return n, nil
}

// TestReaderIdleMidHeader: Idle must not report true once Next has taken
// part of an FPDU's header (a read that returned one byte of the two-byte
// ULPDU_LENGTH, or a leading marker and nothing after it): a source that
// returns ErrWouldBlock there, as Idle allows, must not break the stream.
func TestReaderIdleMidHeader(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	us := ulpdus(rng, 20, 300)
	cases := []struct {
		name    string
		stream  []byte
		markers bool
		step    int
	}{
		{"one byte at a time", plainStream(us, true), false, 1},
		{"markers, four bytes at a time", func() []byte {
			var w markerWriter
			for _, u := range us {
				w.fpdu(u, true)
			}
			return w.out
		}(), true, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := &idleBlockingSource{b: tc.stream, step: tc.step}
			r := NewReader(src, ReaderConfig{CRC: true, Markers: tc.markers, BufSize: 64})
			src.r = r
			var got [][]byte
			for {
				n, err := r.Next()
				if err == ErrWouldBlock {
					continue
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("FPDU %d: %v", len(got), err)
				}
				u := make([]byte, n)
				if err := r.ReadFull(u); err != nil {
					t.Fatalf("FPDU %d: %v", len(got), err)
				}
				if err := r.Finish(); err != nil {
					t.Fatalf("FPDU %d: %v", len(got), err)
				}
				got = append(got, u)
			}
			sameULPDUs(t, got, us)
			if src.blocks == 0 {
				t.Fatal("the source never blocked")
			}
		})
	}
}

// nowaitVec is a vecReader that is also a NoWaitReader: every other
// TryReadVec finds nothing (ErrWouldBlock), as a socket read without
// waiting does while the peer's bytes are still on their way. Its plain
// reads (ReadFull's) never find nothing.
type nowaitVec struct {
	vecReader
	tries, blocks int
}

func (v *nowaitVec) TryReadVec(a, b []byte) (int, error) {
	v.tries++
	if v.tries%2 == 1 {
		v.blocks++
		return 0, ErrWouldBlock
	}
	return v.ReadVec(a, b)
}

// readSome reads len(p) ULPDU bytes with ReadSome, calling it again after
// each ErrWouldBlock (where a caller would wait for the socket); it counts
// those in blocked.
func readSome(t *testing.T, r *Reader, p []byte, blocked *int) error {
	t.Helper()
	for len(p) > 0 {
		n, err := r.ReadSome(p)
		if n < 0 || n > len(p) {
			t.Fatalf("ReadSome of %d bytes returned %d", len(p), n)
		}
		p = p[n:]
		switch {
		case err == ErrWouldBlock:
			*blocked++
		case err != nil:
			return err
		case len(p) > 0:
			t.Fatalf("ReadSome returned %d bytes short and no error", len(p))
		}
	}
	return nil
}

// TestReaderReadSome: ReadSome reads what the source has, stops without
// error state when it has nothing, and goes on where it stopped: payloads,
// CRCs and markers come out as with ReadFull, large payloads still go
// direct, and errors after a stop are the usual ones.
func TestReaderReadSome(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var us [][]byte
	for i := range 16 {
		n := 40000 + rng.IntN(20000)
		if i%4 == 3 {
			n = MinULPDU + rng.IntN(300)
		}
		u := make([]byte, n)
		for j := range u {
			u[j] = byte(rng.Uint32())
		}
		us = append(us, u)
	}
	var mw markerWriter
	for _, u := range us {
		mw.fpdu(u, true)
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		cfg    ReaderConfig
	}{
		{"crc", plainStream(us, true), ReaderConfig{CRC: true, BufSize: 256 << 10}},
		{"no crc", plainStream(us, false), ReaderConfig{BufSize: 256 << 10}},
		{"markers", mw.out, ReaderConfig{CRC: true, Markers: true, BufSize: 4096}},
		{"small buffer", plainStream(us, true), ReaderConfig{CRC: true, BufSize: 64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &nowaitVec{vecReader: vecReader{chunkReader: chunkReader{b: tc.stream, sizes: []int{7000, 3, 65536, 1, 20000}}}}
			r := NewReader(src, tc.cfg)
			blocked := 0
			var got [][]byte
			for {
				n, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("FPDU %d: %v", len(got), err)
				}
				u := make([]byte, n)
				// Some of it with ReadSome, a little with ReadFull
				// between, the rest with ReadSome again.
				third := n / 3
				if err := readSome(t, r, u[:third], &blocked); err != nil {
					t.Fatal(err)
				}
				if err := r.ReadFull(u[third : third+5]); err != nil {
					t.Fatal(err)
				}
				if err := readSome(t, r, u[third+5:], &blocked); err != nil {
					t.Fatal(err)
				}
				if r.Remaining() != 0 {
					t.Fatalf("FPDU %d: %d bytes remain", len(got), r.Remaining())
				}
				if err := r.Finish(); err != nil {
					t.Fatalf("FPDU %d: %v", len(got), err)
				}
				got = append(got, u)
			}
			sameULPDUs(t, got, us)
			// Only ReadSome reads with TryReadVec: each time the source
			// found nothing, ReadSome stopped.
			if blocked == 0 || blocked != src.blocks {
				t.Fatalf("ReadSome stopped %d times, the source found nothing %d times", blocked, src.blocks)
			}
			if !tc.cfg.Markers && tc.cfg.BufSize > 4096 && src.direct < 40000*len(us)/2 {
				t.Fatalf("%d payload bytes placed directly", src.direct)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		s := plainStream(us[:2], true)
		bad := append([]byte(nil), s...)
		bad[100] ^= 1
		r := NewReader(&nowaitVec{vecReader: vecReader{chunkReader: chunkReader{b: bad, sizes: []int{50}}}}, ReaderConfig{CRC: true})
		n, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		blocked := 0
		if err := readSome(t, r, make([]byte, n), &blocked); err != nil {
			t.Fatal(err)
		}
		var te *term.Error
		if err := r.Finish(); !errors.As(err, &te) || te.Cause.Code != term.MPACRC {
			t.Fatalf("corrupt payload read with ReadSome: %v, want a CRC error", err)
		}
		// The stream ends inside an FPDU: io.ErrUnexpectedEOF, sticky.
		r = NewReader(&nowaitVec{vecReader: vecReader{chunkReader: chunkReader{b: s[:1000], sizes: []int{300}}}}, ReaderConfig{CRC: true})
		if n, err = r.Next(); err != nil {
			t.Fatal(err)
		}
		if err := readSome(t, r, make([]byte, n), &blocked); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("truncated stream: %v", err)
		}
		if _, err := r.ReadSome(make([]byte, 1)); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error not sticky: %v", err)
		}
		// Asking past the ULPDU is refused, and changes nothing.
		r = NewReader(&nowaitVec{vecReader: vecReader{chunkReader: chunkReader{b: s, sizes: []int{1 << 20}}}}, ReaderConfig{CRC: true})
		if n, err = r.Next(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadSome(make([]byte, n+1)); !errors.Is(err, errBeyond) {
			t.Fatalf("ReadSome past the ULPDU: %v", err)
		}
		if err := readSome(t, r, make([]byte, n), &blocked); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("plain source", func(t *testing.T) {
		// A source with no TryReadVec: ReadSome waits, as ReadFull does,
		// and reads the same.
		stream := plainStream(us[:3], true)
		src := func() *chunkReader { return &chunkReader{b: stream, sizes: []int{999}} }
		got, err := fuzzReadWith(t, NewReader(src(), ReaderConfig{CRC: true}), stream, true)
		want, werr := fuzzRead(t, NewReader(src(), ReaderConfig{CRC: true}), stream)
		if err != io.EOF || werr != io.EOF {
			t.Fatalf("ReadSome: %v; ReadFull: %v", err, werr)
		}
		sameULPDUs(t, got, want)
	})
}
