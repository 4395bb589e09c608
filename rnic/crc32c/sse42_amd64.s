#include "textflag.h"

// Kernels built on the SSE4.2 CRC32 instruction alone. All functions take
// and return the raw (non-inverted) CRC register. Each body is included
// twice: once reading memory directly, once (copy variant) loading each
// value into a register, storing it at the same offset in dst (R10 holds
// dst - src) and adding the register to the CRC.

#define CRCQ(off) CRC32Q off(SI), AX
#define CRCL(off) CRC32L off(SI), AX
#define CRCW(off) CRC32W off(SI), AX
#define CRCB(off) CRC32B off(SI), AX

// func crcSSE42(crc uint32, p *byte, n int) uint32
TEXT ·crcSSE42(SB), NOSPLIT, $0-28
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
#include "body_sse42_amd64.h"
	MOVL AX, ret+24(FP)
	RET

#undef CRCQ
#undef CRCL
#undef CRCW
#undef CRCB
#define CRCQ(off) MOVQ off(SI), DX; MOVQ DX, off(SI)(R10*1); CRC32Q DX, AX
#define CRCL(off) MOVL off(SI), DX; MOVL DX, off(SI)(R10*1); CRC32L DX, AX
#define CRCW(off) MOVW off(SI), DX; MOVW DX, off(SI)(R10*1); CRC32W DX, AX
#define CRCB(off) MOVB off(SI), DX; MOVB DX, off(SI)(R10*1); CRC32B DX, AX

// func crcSSE42Copy(crc uint32, dst, src *byte, n int) uint32
TEXT ·crcSSE42Copy(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ dst+8(FP), R10
	MOVQ src+16(FP), SI
	MOVQ n+24(FP), CX
	SUBQ SI, R10
#include "body_sse42_amd64.h"
	MOVL AX, ret+32(FP)
	RET

// crcSSE42x3 runs three independent CRC streams over p[0:k], p[k:2k] and
// p[2k:3k] so that three CRC32 instructions are in flight at once.
// k must be a positive multiple of 16.

#define CRCQ3(off) \
	CRC32Q off(SI), AX \
	CRC32Q off(DI), BX \
	CRC32Q off(R8), DX

// func crcSSE42x3(a, b, c uint32, p *byte, k int) (ra, rb, rc uint32)
TEXT ·crcSSE42x3(SB), NOSPLIT, $0-44
	MOVL a+0(FP), AX
	MOVL b+4(FP), BX
	MOVL c+8(FP), DX
	MOVQ p+16(FP), SI
	MOVQ k+24(FP), CX
	LEAQ (SI)(CX*1), DI
	LEAQ (DI)(CX*1), R8
#include "body_sse42x3_amd64.h"
	MOVL AX, ra+32(FP)
	MOVL BX, rb+36(FP)
	MOVL DX, rc+40(FP)
	RET

#undef CRCQ3
#define CRCQ3(off) \
	MOVQ   off(SI), R11        \
	MOVQ   off(DI), R12        \
	MOVQ   off(R8), R13        \
	MOVQ   R11, off(SI)(R10*1) \
	MOVQ   R12, off(DI)(R10*1) \
	MOVQ   R13, off(R8)(R10*1) \
	CRC32Q R11, AX             \
	CRC32Q R12, BX             \
	CRC32Q R13, DX

// crcSSE42x3Copy is crcSSE42x3 that also copies src[0:3k] to dst[0:3k].
//
// func crcSSE42x3Copy(a, b, c uint32, dst, src *byte, k int) (ra, rb, rc uint32)
TEXT ·crcSSE42x3Copy(SB), NOSPLIT, $0-52
	MOVL a+0(FP), AX
	MOVL b+4(FP), BX
	MOVL c+8(FP), DX
	MOVQ dst+16(FP), R10
	MOVQ src+24(FP), SI
	MOVQ k+32(FP), CX
	SUBQ SI, R10
	LEAQ (SI)(CX*1), DI
	LEAQ (DI)(CX*1), R8
#include "body_sse42x3_amd64.h"
	MOVL AX, ra+40(FP)
	MOVL BX, rb+44(FP)
	MOVL DX, rc+48(FP)
	RET
