package crc32c

import "github.com/klauspost/cpuid/v2"

// expectedBest names the kernel Kernel() must report on this CPU.
func expectedBest() string {
	if cpuid.CPU.Supports(cpuid.CRC32) {
		return "arm64-crc32"
	}
	return "generic"
}
