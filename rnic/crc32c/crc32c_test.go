package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func ref(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// iterations scales random-length loops down under -short and -race, where
// the checks are slow but still useful.
func iterations(n int) int {
	if testing.Short() || raceEnabled {
		return max(n/8, 4)
	}
	return n
}

func TestKnownVectors(t *testing.T) {
	seq := func(f func(i int) byte) []byte {
		b := make([]byte, 32)
		for i := range b {
			b[i] = f(i)
		}
		return b
	}
	vectors := []struct {
		name string
		in   []byte
		want uint32
	}{
		{"123456789", []byte("123456789"), 0xE3069283},
		{"32x00", seq(func(int) byte { return 0 }), 0x8A9136AA},
		{"32xFF", seq(func(int) byte { return 0xFF }), 0x62A8AB43},
		{"00..1F", seq(func(i int) byte { return byte(i) }), 0x46DD794E},
		{"1F..00", seq(func(i int) byte { return byte(31 - i) }), 0x113FDB5C},
		{"empty", nil, 0},
	}
	for _, k := range kernels {
		for _, v := range vectors {
			if got := k.update(0, v.in); got != v.want {
				t.Errorf("%s update(%s) = %#08x, want %#08x", k.name, v.name, got, v.want)
			}
			dst := make([]byte, len(v.in))
			if got := k.updateCopy(0, dst, v.in); got != v.want {
				t.Errorf("%s updateCopy(%s) = %#08x, want %#08x", k.name, v.name, got, v.want)
			}
		}
	}
	for _, v := range vectors {
		if got := Checksum(v.in); got != v.want {
			t.Errorf("Checksum(%s) = %#08x, want %#08x", v.name, got, v.want)
		}
	}
}

// checkKernel compares one kernel with hash/crc32 on src (and checks the
// copy and its guard bytes). buf is scratch space for the destination.
func checkKernel(t *testing.T, k kernel, rng *rand.Rand, src, buf []byte, dstAlign int) {
	t.Helper()
	n := len(src)
	crc := rng.Uint32()
	want := ref(crc, src)
	if got := k.update(crc, src); got != want {
		t.Fatalf("%s update len=%d crc=%#x: got %#08x want %#08x", k.name, n, crc, got, want)
	}

	// dst = buf[lo : lo+n] with lo = guard+dstAlign; the guard bytes on
	// both sides (at least 64) hold a canary. dst itself must equal src
	// afterwards, so checking the guards covers every byte outside dst.
	const guard = 64
	lo := guard + dstAlign
	buf = buf[:lo+n+guard]
	for i := range buf[:lo] {
		buf[i] = canary(i)
	}
	for i := lo + n; i < len(buf); i++ {
		buf[i] = canary(i)
	}
	dst := buf[lo : lo+n : lo+n]
	if got := k.updateCopy(crc, dst, src); got != want {
		t.Fatalf("%s updateCopy len=%d crc=%#x dstAlign=%d: got %#08x want %#08x", k.name, n, crc, dstAlign, got, want)
	}
	if !bytes.Equal(dst, src) {
		t.Fatalf("%s updateCopy len=%d dstAlign=%d: dst != src", k.name, n, dstAlign)
	}
	for i := range buf[:lo] {
		if buf[i] != canary(i) {
			t.Fatalf("%s updateCopy len=%d dstAlign=%d: wrote before dst at offset %d", k.name, n, dstAlign, i-lo)
		}
	}
	for i := lo + n; i < len(buf); i++ {
		if buf[i] != canary(i) {
			t.Fatalf("%s updateCopy len=%d dstAlign=%d: wrote after dst at offset %d", k.name, n, dstAlign, i-lo)
		}
	}
}

func canary(i int) byte { return byte(0xA5 ^ i*7) }

// TestKernelsAllLengths: every kernel, every length 0..4096, every
// alignment 0..63 of the source and, for each length, every alignment
// 0..63 of the destination (source alignment a goes with destination
// alignment 5a+n mod 64, a permutation). Under the race detector, which
// slows the pure-Go kernel about tenfold and instruments none of the
// assembly, every 7th source alignment: `make test` also runs this test
// without it.
func TestKernelsAllLengths(t *testing.T) {
	const maxLen = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, maxLen+64)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	buf := make([]byte, maxLen+64+128)
	step := 1
	if raceEnabled || testing.Short() {
		step = 7
	}
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			checks := 0
			for n := 0; n <= maxLen; n++ {
				for a := n % step; a < 64; a += step {
					checkKernel(t, k, rng, data[a:a+n], buf, (5*a+n)%64)
					checks++
				}
			}
			t.Logf("%s: %d (length, source alignment, destination alignment) checks", k.name, checks)
		})
	}
}

func TestKernelsAlignments(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Lengths around each kernel's internal thresholds: widths, foldMin,
	// the smallest hybrid blocks (AVX2 from 1360 bytes, AVX-512 from 4000).
	lengths := []int{0, 1, 15, 16, 63, 64, 65, 127, 128, 255, 256, 257, 511, 512, 513,
		1000, 1024, 1400, 2047, 2048, 4000, 4133}
	data := make([]byte, 4133+64)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	buf := make([]byte, len(data)+128)
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			for sa := 0; sa < 64; sa++ {
				for da := 0; da < 64; da += 1 + 6*boolInt(raceEnabled) {
					for _, n := range lengths {
						checkKernel(t, k, rng, data[sa:sa+n], buf, da)
					}
				}
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestKernelsRandomLengths(t *testing.T) {
	const maxLen = 1 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	data := make([]byte, maxLen+64)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	buf := make([]byte, maxLen+64+128)
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			iters := iterations(200)
			if k.name == "generic" {
				iters = max(iters/4, 4)
			}
			for i := 0; i < iters; i++ {
				n := rng.IntN(maxLen + 1)
				if i%2 == 0 {
					n = rng.IntN(64 << 10) // favour packet-sized inputs
				}
				sa := rng.IntN(64)
				checkKernel(t, k, rng, data[sa:sa+n], buf, rng.IntN(64))
			}
		})
	}
}

// TestChaining checks Update(Update(c, a), b) == Update(c, a||b) at every
// split point, so the kernels agree on the register state between calls.
func TestChaining(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	data := make([]byte, 700)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, k := range kernels {
		for split := 0; split <= len(data); split++ {
			crc := rng.Uint32()
			want := ref(crc, data)
			if got := k.update(k.update(crc, data[:split]), data[split:]); got != want {
				t.Fatalf("%s split %d: got %#08x want %#08x", k.name, split, got, want)
			}
		}
	}
}

func TestUpdateCopyShortDstPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("UpdateCopy with short dst did not panic")
		}
	}()
	UpdateCopy(0, make([]byte, 9), make([]byte, 10))
}

func TestUpdateCopyOverlap(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, shift := range []int{-200, -33, -1, 0, 1, 33, 200} {
		buf := make([]byte, 4096)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		want := append([]byte(nil), buf...)
		srcOff, n := 1024, 2000
		copy(want[srcOff+shift:], want[srcOff:srcOff+n])
		wantCRC := ref(1, buf[srcOff:srcOff+n])
		got := UpdateCopy(1, buf[srcOff+shift:], buf[srcOff:srcOff+n])
		if got != wantCRC {
			t.Errorf("shift %d: crc %#08x want %#08x", shift, got, wantCRC)
		}
		if !bytes.Equal(buf, want) {
			t.Errorf("shift %d: buffer differs from copy's result", shift)
		}
	}
}

func TestExported(t *testing.T) {
	p := []byte("The quick brown fox jumps over the lazy dog, again and again and again and again.")
	if got, want := Checksum(p), ref(0, p); got != want {
		t.Errorf("Checksum = %#08x want %#08x", got, want)
	}
	if got, want := Update(0x12345678, p), ref(0x12345678, p); got != want {
		t.Errorf("Update = %#08x want %#08x", got, want)
	}
	dst := make([]byte, len(p)+10)
	if got, want := UpdateCopy(7, dst, p), ref(7, p); got != want {
		t.Errorf("UpdateCopy = %#08x want %#08x", got, want)
	}
	if !bytes.Equal(dst[:len(p)], p) || !bytes.Equal(dst[len(p):], make([]byte, 10)) {
		t.Errorf("UpdateCopy: dst = %q", dst)
	}
	if UpdateCopy(5, nil, nil) != 5 {
		t.Error("UpdateCopy of nothing changed the crc")
	}
}

func TestKernelSelection(t *testing.T) {
	if len(kernels) == 0 || kernels[len(kernels)-1].name != "generic" {
		t.Fatalf("kernel list %v must end with generic", kernelNames())
	}
	if Kernel() != kernels[0].name {
		t.Errorf("Kernel() = %q, want the first of %v", Kernel(), kernelNames())
	}
	seen := map[string]bool{}
	for _, k := range kernels {
		if seen[k.name] {
			t.Errorf("kernel %q listed twice", k.name)
		}
		seen[k.name] = true
	}
	if want := expectedBest(); want != "" && Kernel() != want {
		t.Errorf("Kernel() = %q, want %q on this CPU (kernels %v)", Kernel(), want, kernelNames())
	}
	t.Logf("kernel %s, available %v", Kernel(), kernelNames())
}

func kernelNames() []string {
	var s []string
	for _, k := range kernels {
		s = append(s, k.name)
	}
	return s
}

func ExampleUpdateCopy() {
	payload := []byte("123456789")
	region := make([]byte, 16)
	crc := UpdateCopy(0, region, payload)
	fmt.Printf("%#08x %q\n", crc, region[:len(payload)])
	// Output: 0xe3069283 "123456789"
}

// FuzzKernels checks every kernel against hash/crc32 on arbitrary input,
// starting register and split point, including the copy and its bounds.
func FuzzKernels(f *testing.F) {
	f.Add([]byte("123456789"), uint32(0), uint16(4))
	f.Add(bytes.Repeat([]byte{0xFF}, 32), uint32(0xFFFFFFFF), uint16(16))
	f.Add(bytes.Repeat([]byte{0x5A}, 4133), uint32(0x12345678), uint16(4000))
	f.Fuzz(func(t *testing.T, p []byte, crc uint32, split uint16) {
		s := int(split) % (len(p) + 1)
		want := ref(crc, p)
		buf := make([]byte, len(p)+2)
		for _, k := range kernels {
			if got := k.update(k.update(crc, p[:s]), p[s:]); got != want {
				t.Fatalf("%s: split %d of %d: got %#08x want %#08x", k.name, s, len(p), got, want)
			}
			buf[0], buf[len(buf)-1] = 0xC3, 0x3C
			dst := buf[1 : len(p)+1 : len(p)+1]
			if got := k.updateCopy(crc, dst, p); got != want || !bytes.Equal(dst, p) {
				t.Fatalf("%s: updateCopy of %d bytes: got %#08x want %#08x", k.name, len(p), got, want)
			}
			if buf[0] != 0xC3 || buf[len(buf)-1] != 0x3C {
				t.Fatalf("%s: updateCopy of %d bytes wrote outside dst", k.name, len(p))
			}
		}
	})
}
