package crc32c

import "unsafe"

// Hybrid blocks keep the carry-less multiplier and the CRC32 instruction
// busy at the same time: per iteration the vector unit folds vec bytes and
// three CRC32 streams cover hybridStream bytes each (layout in
// fold_amd64.h). On CPUs where PCLMULQDQ issues at most every other cycle
// whatever the vector width (the AMD EPYC this was tuned on), this adds the
// CRC32 unit's throughput to the folding's. The stream length was chosen by
// measurement: 48 bytes did best of 16, 32, 48 and 64 for every kernel.

//go:noescape
func crcAVX512Block(crc uint32, p *byte, m int, k *[4]uint32) uint32

//go:noescape
func crcAVX2Block(crc uint32, p *byte, m int, k *[4]uint32) uint32

//go:noescape
func crcAVX2BlockCopy(crc uint32, dst, src *byte, m int, k *[4]uint32) uint32

//go:noescape
func crcPCLMULBlock(crc uint32, p *byte, m int, k *[4]uint32) uint32

//go:noescape
func crcPCLMULBlockCopy(crc uint32, dst, src *byte, m int, k *[4]uint32) uint32

const (
	// hybridStream is the bytes each CRC32 stream covers per iteration; the
	// assembly hard-codes it.
	hybridStream = 48
	// hybridMaxIter bounds the iterations in one block (and the tables).
	hybridMaxIter = 128
)

// hybridShape is the geometry of one kernel's blocks and the multipliers
// that join them: k[m] holds x^(8L-33) mod P for L = S, 2S, 3S and T,
// which move a partial CRC over the rest of an m-iteration block
// (S = m·hybridStream, T = m·iter) or over a whole block.
type hybridShape struct {
	iter    int // bytes per iteration: vec + 3·hybridStream
	minIter int // the smallest block worth its join cost
	k       *[hybridMaxIter + 1][4]uint32
}

func newHybridShape(vec, minIter int) hybridShape {
	h := hybridShape{iter: vec + 3*hybridStream, minIter: minIter, k: new([hybridMaxIter + 1][4]uint32)}
	for m := 1; m <= hybridMaxIter; m++ {
		s := uint64(m * hybridStream)
		t := uint64(m * h.iter)
		h.k[m] = [4]uint32{xPow(8*s - 33), xPow(16*s - 33), xPow(24*s - 33), xPow(8*t - 33)}
	}
	return h
}

// next returns the iterations of the next block for rest bytes, 0 if the
// rest is too short for a block.
func (h hybridShape) next(rest int) int {
	if rest < h.minIter*h.iter {
		return 0
	}
	return min(rest/h.iter, hybridMaxIter)
}

type hybridUpdate struct {
	hybridShape
	block func(crc uint32, p *byte, m int, k *[4]uint32) uint32
}

// run processes the longest prefix of p that blocks cover and returns the
// new raw register and the number of bytes consumed.
func (h *hybridUpdate) run(r uint32, p []byte) (uint32, int) {
	done := 0
	for m := h.next(len(p)); m > 0; m = h.next(len(p) - done) {
		r = h.block(r, unsafe.SliceData(p[done:]), m, &h.k[m])
		done += m * h.iter
	}
	return r, done
}

type hybridCopy struct {
	hybridShape
	block func(crc uint32, dst, src *byte, m int, k *[4]uint32) uint32
}

// run is hybridUpdate.run that also copies the consumed prefix to dst.
func (h *hybridCopy) run(r uint32, dst, src []byte) (uint32, int) {
	done := 0
	for m := h.next(len(src)); m > 0; m = h.next(len(src) - done) {
		r = h.block(r, unsafe.SliceData(dst[done:]), unsafe.SliceData(src[done:]), m, &h.k[m])
		done += m * h.iter
	}
	return r, done
}

// The minimum block sizes were measured: below them the plain folding
// kernel is faster than a block plus its join (about 4 KB for AVX-512,
// 1.4 KB for AVX2; the SSE folding alone is slower than any block).
var (
	avx512Hybrid     = &hybridUpdate{newHybridShape(256, 10), crcAVX512Block}
	avx2Hybrid       = &hybridUpdate{newHybridShape(128, 5), crcAVX2Block}
	avx2HybridCopy   = &hybridCopy{newHybridShape(128, 5), crcAVX2BlockCopy}
	pclmulHybrid     = &hybridUpdate{newHybridShape(64, 2), crcPCLMULBlock}
	pclmulHybridCopy = &hybridCopy{newHybridShape(64, 2), crcPCLMULBlockCopy}
)
