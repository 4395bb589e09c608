package crc32c

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/klauspost/cpuid/v2"
)

// expectedBest names the kernel Kernel() must report on this CPU.
func expectedBest() string {
	c := &cpuid.CPU
	switch {
	case !c.Supports(cpuid.SSE42):
		return "generic"
	case c.Supports(cpuid.AVX512F, cpuid.AVX2, cpuid.VPCLMULQDQ, cpuid.CLMUL):
		return "avx512-vpclmul"
	case c.Supports(cpuid.AVX2, cpuid.VPCLMULQDQ, cpuid.CLMUL):
		return "avx2-vpclmul"
	case c.Supports(cpuid.CLMUL, cpuid.SSE4):
		return "sse42-pclmul"
	}
	return "sse42"
}

// foldPair returns the two quadwords that fold a 128-bit chunk forward by d
// bits: x^(d+31) and x^(d-33) mod P (see consts_amd64.s).
func foldPair(d uint64) [2]uint64 {
	return [2]uint64{uint64(xPow(d + 31)), uint64(xPow(d - 33))}
}

// TestAsmConstants recomputes every DATA constant in consts_amd64.s.
func TestAsmConstants(t *testing.T) {
	want := map[string][]uint64{}
	for _, d := range []uint64{128, 256, 512, 1024, 2048} {
		p := foldPair(d)
		want["kFold"+strconv.FormatUint(d, 10)] = p[:]
	}
	var red []uint64
	for _, d := range []uint64{384, 256, 128} {
		p := foldPair(d)
		red = append(red, p[:]...)
	}
	want["kReduce512"] = append(red, 0, 0)

	src, err := os.ReadFile("consts_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^DATA ·(\w+)\+(\d+)\(SB\)/8, \$(\w+)$`)
	got := map[string][]uint64{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		off, _ := strconv.Atoi(m[2])
		v, err := strconv.ParseUint(m[3], 0, 64)
		if err != nil {
			t.Fatalf("DATA %s+%s: %v", m[1], m[2], err)
		}
		if off != 8*len(got[m[1]]) {
			t.Fatalf("DATA %s: offset %d out of order", m[1], off)
		}
		got[m[1]] = append(got[m[1]], v)
	}
	if len(got) != len(want) {
		t.Errorf("consts_amd64.s defines %d constants, want %d", len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if len(g) != len(w) {
			t.Errorf("%s: %d quadwords, want %d", name, len(g), len(w))
			continue
		}
		for i := range w {
			if g[i] != w[i] {
				t.Errorf("DATA ·%s+%d(SB)/8, $%#08x  // want $%#08x", name, 8*i, g[i], w[i])
			}
		}
	}
}
