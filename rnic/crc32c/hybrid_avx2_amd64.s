#include "textflag.h"
#include "fold_amd64.h"

// Hybrid blocks for AVX2 (layout in fold_amd64.h): each iteration folds 128
// bytes in four ymm accumulators while three CRC32 streams advance 48 bytes
// each. The functions take and return the raw CRC register; m >= 1. The
// body is included twice; the copy variant stores every loaded vector and
// quadword at the same offset in dst (R10 holds dst - src).

#define LDY(off, r) VMOVDQU off(SI), r
#define LOAD4
#define D0 0(SI)
#define D1 32(SI)
#define D2 64(SI)
#define D3 96(SI)
#define CSETUP
#define S3(off) CRC3(off)
#define CADV

// func crcAVX2Block(crc uint32, p *byte, m int, k *[4]uint32) uint32
TEXT ·crcAVX2Block(SB), NOSPLIT, $0-36
	MOVQ p+8(FP), SI
	MOVQ m+16(FP), CX
#include "body_hybrid_avx2_amd64.h"
	MOVL crc+0(FP), R12
	MOVQ k+24(FP), R11
	COMBINE(R12, R13, R11)
	VZEROUPPER
	MOVL AX, ret+32(FP)
	RET

#undef LDY
#undef LOAD4
#undef D0
#undef D1
#undef D2
#undef D3
#undef CSETUP
#undef S3
#undef CADV
#define LDY(off, r) VMOVDQU off(SI), r; VMOVDQU r, off(SI)(R10*1)
#define LOAD4 LDY(0, Y8); LDY(32, Y9); LDY(64, Y10); LDY(96, Y11)
#define D0 Y8
#define D1 Y9
#define D2 Y10
#define D3 Y11
#define CSETUP LEAQ (R8)(R10*1), R12
#define S3(off) CRC3COPY(off)
#define CADV ADDQ $48, R12

// func crcAVX2BlockCopy(crc uint32, dst, src *byte, m int, k *[4]uint32) uint32
TEXT ·crcAVX2BlockCopy(SB), NOSPLIT, $0-44
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ m+24(FP), CX
	SUBQ SI, R10
#include "body_hybrid_avx2_amd64.h"
	MOVL crc+0(FP), R12
	MOVQ k+32(FP), R11
	COMBINE(R12, R13, R11)
	VZEROUPPER
	MOVL AX, ret+40(FP)
	RET
