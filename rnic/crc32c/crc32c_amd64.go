package crc32c

import (
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// Assembly kernels. All take and return the raw (non-inverted) register.
// The folding kernels need n >= 64 and n a multiple of their width (16, 32
// or 64 bytes); the Go wrappers below finish the tail with crcSSE42.

//go:noescape
func crcSSE42(crc uint32, p *byte, n int) uint32

//go:noescape
func crcSSE42Copy(crc uint32, dst, src *byte, n int) uint32

//go:noescape
func crcSSE42x3(a, b, c uint32, p *byte, k int) (ra, rb, rc uint32)

//go:noescape
func crcSSE42x3Copy(a, b, c uint32, dst, src *byte, k int) (ra, rb, rc uint32)

//go:noescape
func crcPCLMUL(crc uint32, p *byte, n int) uint32

//go:noescape
func crcPCLMULCopy(crc uint32, dst, src *byte, n int) uint32

//go:noescape
func crcAVX2(crc uint32, p *byte, n int) uint32

//go:noescape
func crcAVX2Copy(crc uint32, dst, src *byte, n int) uint32

//go:noescape
func crcAVX512(crc uint32, p *byte, n int) uint32

//go:noescape
func crcAVX512Copy(crc uint32, dst, src *byte, n int) uint32

// archKernels returns the assembly kernels this CPU supports, best first.
func archKernels() []kernel {
	var ks []kernel
	c := &cpuid.CPU
	if !c.Supports(cpuid.SSE42) {
		return nil
	}
	if c.Supports(cpuid.AVX512F, cpuid.AVX2, cpuid.VPCLMULQDQ, cpuid.CLMUL) {
		ks = append(ks, kernel{"avx512-vpclmul", avx512Update, avx512UpdateCopy})
	}
	if c.Supports(cpuid.AVX2, cpuid.VPCLMULQDQ, cpuid.CLMUL) {
		ks = append(ks, kernel{"avx2-vpclmul", avx2Update, avx2UpdateCopy})
	}
	if c.Supports(cpuid.CLMUL, cpuid.SSE4) {
		ks = append(ks, kernel{"sse42-pclmul", pclmulUpdate, pclmulUpdateCopy})
	}
	return append(ks, sse42.kernel("sse42"))
}

// foldMin is the shortest input handed to a folding kernel; shorter inputs
// go to the CRC32 instruction directly.
const foldMin = 256

// vecUpdate runs hybrid blocks (if h is not nil), then the plain folding
// kernel fold (which takes a multiple of width bytes), then CRC32
// instructions for the tail.
func vecUpdate(crc uint32, p []byte, h *hybridUpdate, width int, fold func(uint32, *byte, int) uint32) uint32 {
	r := ^crc
	if len(p) >= foldMin {
		if h != nil {
			var done int
			r, done = h.run(r, p)
			p = p[done:]
		}
		if len(p) >= foldMin {
			n := len(p) &^ (width - 1)
			r = fold(r, unsafe.SliceData(p), n)
			p = p[n:]
		}
	}
	return ^crcSSE42(r, unsafe.SliceData(p), len(p))
}

// vecUpdateCopy is vecUpdate that also copies src to dst.
func vecUpdateCopy(crc uint32, dst, src []byte, h *hybridCopy, width int, fold func(uint32, *byte, *byte, int) uint32) uint32 {
	dst = dst[:len(src)]
	r := ^crc
	if len(src) >= foldMin {
		if h != nil {
			var done int
			r, done = h.run(r, dst, src)
			dst, src = dst[done:], src[done:]
		}
		if len(src) >= foldMin {
			n := len(src) &^ (width - 1)
			r = fold(r, unsafe.SliceData(dst), unsafe.SliceData(src), n)
			dst, src = dst[n:], src[n:]
		}
	}
	return ^crcSSE42Copy(r, unsafe.SliceData(dst), unsafe.SliceData(src), len(src))
}

func avx512Update(crc uint32, p []byte) uint32 {
	return vecUpdate(crc, p, avx512Hybrid, 64, crcAVX512)
}

func avx512UpdateCopy(crc uint32, dst, src []byte) uint32 {
	return vecUpdateCopy(crc, dst, src, nil, 64, crcAVX512Copy)
}

func avx2Update(crc uint32, p []byte) uint32 {
	return vecUpdate(crc, p, avx2Hybrid, 32, crcAVX2)
}

func avx2UpdateCopy(crc uint32, dst, src []byte) uint32 {
	return vecUpdateCopy(crc, dst, src, avx2HybridCopy, 32, crcAVX2Copy)
}

func pclmulUpdate(crc uint32, p []byte) uint32 {
	return vecUpdate(crc, p, pclmulHybrid, 16, crcPCLMUL)
}

func pclmulUpdateCopy(crc uint32, dst, src []byte) uint32 {
	return vecUpdateCopy(crc, dst, src, pclmulHybridCopy, 16, crcPCLMULCopy)
}
