#include "textflag.h"
#include "fold_amd64.h"

// Hybrid blocks for SSE4.2 + PCLMULQDQ (layout in fold_amd64.h): each
// iteration folds 64 bytes in four xmm accumulators while three CRC32
// streams advance 48 bytes each. The functions take and return the raw CRC
// register; m >= 1. The body is included twice; the copy variant stores
// every loaded vector and quadword at the same offset in dst (R10 holds
// dst - src).

#define LDX(off, r) MOVOU off(SI), r
#define CSETUP
#define S3(off) CRC3(off)
#define CADV

// func crcPCLMULBlock(crc uint32, p *byte, m int, k *[4]uint32) uint32
TEXT ·crcPCLMULBlock(SB), NOSPLIT, $0-36
	MOVQ p+8(FP), SI
	MOVQ m+16(FP), CX
#include "body_hybrid_sse_amd64.h"
	MOVL crc+0(FP), R12
	MOVQ k+24(FP), R11
	COMBINESSE(R12, R13, R11)
	MOVL AX, ret+32(FP)
	RET

#undef LDX
#undef CSETUP
#undef S3
#undef CADV
#define LDX(off, r) MOVOU off(SI), r; MOVOU r, off(SI)(R10*1)
#define CSETUP LEAQ (R8)(R10*1), R12
#define S3(off) CRC3COPY(off)
#define CADV ADDQ $48, R12

// func crcPCLMULBlockCopy(crc uint32, dst, src *byte, m int, k *[4]uint32) uint32
TEXT ·crcPCLMULBlockCopy(SB), NOSPLIT, $0-44
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ m+24(FP), CX
	SUBQ SI, R10
#include "body_hybrid_sse_amd64.h"
	MOVL crc+0(FP), R12
	MOVQ k+32(FP), R11
	COMBINESSE(R12, R13, R11)
	MOVL AX, ret+40(FP)
	RET
