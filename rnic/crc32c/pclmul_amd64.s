#include "textflag.h"
#include "fold_amd64.h"

// 128-bit folding with SSE4.1 and PCLMULQDQ. The functions take and return
// the raw CRC register; n must be a multiple of 16 and at least 64. The
// caller finishes any tail with crcSSE42. The body is included twice; the
// copy variant stores every loaded chunk at the same offset in dst (R10
// holds dst - src).

#define LDX(off, r) MOVOU off(SI), r

// func crcPCLMUL(crc uint32, p *byte, n int) uint32
TEXT ·crcPCLMUL(SB), NOSPLIT, $0-28
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
#include "body_pclmul_amd64.h"
	MOVL AX, ret+24(FP)
	RET

#undef LDX
#define LDX(off, r) MOVOU off(SI), r; MOVOU r, off(SI)(R10*1)

// func crcPCLMULCopy(crc uint32, dst, src *byte, n int) uint32
TEXT ·crcPCLMULCopy(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ n+24(FP), CX
	SUBQ SI, R10
#include "body_pclmul_amd64.h"
	MOVL AX, ret+32(FP)
	RET
