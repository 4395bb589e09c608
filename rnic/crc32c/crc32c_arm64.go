package crc32c

import "github.com/klauspost/cpuid/v2"

// Assembly kernels (crc32c_arm64.s), on the ARMv8 CRC32C instructions.
// All take and return the raw (non-inverted) register.

//go:noescape
func crcARM64(crc uint32, p *byte, n int) uint32

//go:noescape
func crcARM64Copy(crc uint32, dst, src *byte, n int) uint32

//go:noescape
func crcARM64x3(a, b, c uint32, p *byte, k int) (ra, rb, rc uint32)

//go:noescape
func crcARM64x3Copy(a, b, c uint32, dst, src *byte, k int) (ra, rb, rc uint32)

// arm64 runs on the three-stream driver of x3.go.
var arm64 = &x3Funcs{x3: crcARM64x3, x3Copy: crcARM64x3Copy, one: crcARM64, oneCopy: crcARM64Copy}

// archKernels returns the CRC32C-instruction kernel when the CPU has the
// instructions (optional in ARMv8.0, required from ARMv8.1).
func archKernels() []kernel {
	if !cpuid.CPU.Supports(cpuid.CRC32) {
		return nil
	}
	return []kernel{arm64.kernel("arm64-crc32")}
}
