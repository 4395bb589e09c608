package crc32c

import "unsafe"

// kernel is one implementation of the checksum. update and updateCopy have
// the same semantics as Update and UpdateCopy; updateCopy may assume
// len(dst) >= len(src) and that dst and src do not partially overlap.
type kernel struct {
	name       string
	update     func(crc uint32, p []byte) uint32
	updateCopy func(crc uint32, dst, src []byte) uint32
}

var generic = kernel{name: "generic", update: genericUpdate, updateCopy: genericUpdateCopy}

// kernels lists every implementation usable on this CPU, best first. It is
// computed once at init and never modified; tests iterate it.
var kernels = append(archKernels(), generic)

// best is the kernel used by the exported functions, kernels[0].
var best = kernels[0]

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return best.update(0, p) }

// Update returns the result of adding the bytes in p to crc, with the same
// meaning as hash/crc32.Update with the Castagnoli table: Update(0, p) ==
// Checksum(p) and Update(Update(0, a), b) == Checksum(a||b).
func Update(crc uint32, p []byte) uint32 { return best.update(crc, p) }

// UpdateCopy copies src into dst[:len(src)] and returns crc updated over src
// (as Update(crc, src) would), reading and writing the data once. It never
// writes outside dst[:len(src)]. It panics if len(dst) < len(src), which is a
// caller bug. If dst and src overlap, the result is as if the copy were made
// with the built-in copy first.
func UpdateCopy(crc uint32, dst, src []byte) uint32 {
	if len(dst) < len(src) {
		panic("crc32c: UpdateCopy: len(dst) < len(src)")
	}
	n := len(src)
	if n == 0 {
		return crc
	}
	dst = dst[:n]
	d := uintptr(unsafe.Pointer(&dst[0]))
	s := uintptr(unsafe.Pointer(&src[0]))
	if d == s {
		return best.update(crc, src)
	}
	if d < s+uintptr(n) && s < d+uintptr(n) {
		// Partial overlap: the fused kernels would read bytes they
		// already overwrote. This is never the receive path, so take the
		// simple route.
		copy(dst, src)
		return best.update(crc, dst)
	}
	return best.updateCopy(crc, dst, src)
}

// Kernel names the implementation selected at init, for example
// "avx512-vpclmul", "avx2-vpclmul", "sse42-pclmul", "sse42", "arm64-crc32"
// or "generic".
func Kernel() string { return best.name }
