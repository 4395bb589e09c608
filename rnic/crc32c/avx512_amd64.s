#include "textflag.h"
#include "fold_amd64.h"

// 512-bit folding with AVX-512F and VPCLMULQDQ: each zmm register holds four
// 128-bit chunks that fold independently with the same constant, and
// VPTERNLOGQ merges both products and the new data in one instruction.
// The functions take and return the raw CRC register; n must be a multiple
// of 64 and at least 64. The caller finishes any tail with crcSSE42. The
// body is included twice; the copy variant stores every loaded vector at
// the same offset in dst (R10 holds dst - src).

#define LDZ(off, r) VMOVDQU64 off(SI), r
#define LOAD4
#define LOAD1
#define D0 0(SI)
#define D1 64(SI)
#define D2 128(SI)
#define D3 192(SI)

// func crcAVX512(crc uint32, p *byte, n int) uint32
TEXT ·crcAVX512(SB), NOSPLIT, $0-28
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
#include "body_avx512_amd64.h"
	MOVL AX, ret+24(FP)
	RET

#undef LDZ
#undef LOAD4
#undef LOAD1
#undef D0
#undef D1
#undef D2
#undef D3
#define LDZ(off, r) VMOVDQU64 off(SI), r; VMOVDQU64 r, off(SI)(R10*1)
#define LOAD4 LDZ(0, Z8); LDZ(64, Z9); LDZ(128, Z10); LDZ(192, Z11)
#define LOAD1 LDZ(0, Z8)
#define D0 Z8
#define D1 Z9
#define D2 Z10
#define D3 Z11

// func crcAVX512Copy(crc uint32, dst, src *byte, n int) uint32
TEXT ·crcAVX512Copy(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ n+24(FP), CX
	SUBQ SI, R10
#include "body_avx512_amd64.h"
	MOVL AX, ret+32(FP)
	RET
