#include "textflag.h"
#include "fold_amd64.h"

// 256-bit folding with AVX2 and VEX-encoded VPCLMULQDQ: each ymm register
// holds two 128-bit chunks that fold independently with the same constant.
// The functions take and return the raw CRC register; n must be a multiple
// of 32 and at least 64. The caller finishes any tail with crcSSE42. The
// body is included twice; the copy variant stores every loaded vector at
// the same offset in dst (R10 holds dst - src).

#define LDY(off, r) VMOVDQU off(SI), r
#define LOAD4
#define LOAD1
#define D0 0(SI)
#define D1 32(SI)
#define D2 64(SI)
#define D3 96(SI)

// func crcAVX2(crc uint32, p *byte, n int) uint32
TEXT ·crcAVX2(SB), NOSPLIT, $0-28
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
#include "body_avx2_amd64.h"
	MOVL AX, ret+24(FP)
	RET

#undef LDY
#undef LOAD4
#undef LOAD1
#undef D0
#undef D1
#undef D2
#undef D3
#define LDY(off, r) VMOVDQU off(SI), r; VMOVDQU r, off(SI)(R10*1)
#define LOAD4 LDY(0, Y8); LDY(32, Y9); LDY(64, Y10); LDY(96, Y11)
#define LOAD1 LDY(0, Y8)
#define D0 Y8
#define D1 Y9
#define D2 Y10
#define D3 Y11

// func crcAVX2Copy(crc uint32, dst, src *byte, n int) uint32
TEXT ·crcAVX2Copy(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ n+24(FP), CX
	SUBQ SI, R10
#include "body_avx2_amd64.h"
	MOVL AX, ret+32(FP)
	RET
