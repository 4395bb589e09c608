// Package crc32c computes the CRC-32C (Castagnoli) checksum used by MPA
// (RFC 5044 §8, RFC 3385): reflected polynomial 0x82F63B78, initial value and
// final XOR 0xFFFFFFFF. Results are identical to hash/crc32 with the
// Castagnoli table.
//
// # Kernels
//
// At init the package picks the fastest implementation the CPU supports
// (using github.com/klauspost/cpuid/v2) and never changes it afterwards;
// Kernel reports its name. On amd64, best first:
//
//   - "avx512-vpclmul": AVX-512F + VPCLMULQDQ, folding 64-byte zmm
//     registers (four 128-bit chunks each) with carry-less multiplication.
//   - "avx2-vpclmul": AVX2 + VEX VPCLMULQDQ, the same on 32-byte ymm
//     registers.
//   - "sse42-pclmul": SSE4.2 + PCLMULQDQ, 128-bit folding.
//   - "sse42": the SSE4.2 CRC32 instruction on three interleaved streams,
//     joined with shift tables.
//   - "generic": portable slicing-by-8.
//
// On arm64, "arm64-crc32": the ARMv8 CRC32C instructions (optional in
// ARMv8.0, present from ARMv8.1) on three interleaved streams joined with
// the same shift tables, and "generic" where a core lacks them. Elsewhere
// "generic" alone.
//
// The folding kernels run "hybrid" blocks for long inputs: while the vector
// unit folds one part of a block, three CRC32-instruction streams checksum
// the rest, and the partial CRCs are joined with one carry-less multiply
// each. On CPUs whose carry-less multiplier is the bottleneck this adds the
// CRC32 unit's throughput to the folding's. Short tails always go through
// the CRC32 instruction. The folding constants (x^k mod P) are derived and
// checked in the tests.
//
// # One-pass copy
//
// UpdateCopy is the receive-side placement primitive: payload taken off the
// wire is copied into its memory region and checksummed in the same pass.
// Each vector or quadword is loaded once, stored to the destination and
// folded into the CRC from the register, so the data crosses the memory
// hierarchy once instead of twice (copy, then checksum). The portable kernel
// copies and checksums 4 KiB chunks, which stay in L1 between the two steps.
package crc32c
