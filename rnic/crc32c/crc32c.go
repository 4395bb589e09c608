// Package crc32c computes the CRC-32C (Castagnoli) checksum used by MPA
// (RFC 5044 §8, RFC 3385), with SIMD kernels chosen at run time.
//
// PLACEHOLDER API: the SIMD kernels are being written; until then this uses
// hash/crc32. The exported API is fixed.
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return crc32.Checksum(p, table) }

// Update returns the result of adding the bytes in p to crc, with the same
// meaning as hash/crc32.Update with the Castagnoli table.
func Update(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }

// UpdateCopy copies src into dst (len(dst) >= len(src)) and returns crc
// updated over src, in one pass over the data.
func UpdateCopy(crc uint32, dst, src []byte) uint32 {
	copy(dst, src)
	return crc32.Update(crc, table, src)
}

// Kernel names the implementation in use.
func Kernel() string { return "placeholder" }
