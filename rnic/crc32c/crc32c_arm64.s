#include "textflag.h"

// CRC-32C with the ARMv8 CRC32C instructions (crc32c_arm64.go). Every
// function takes and returns the raw register; loads and stores need no
// alignment.

// CRC4 folds the four quadwords in R3-R6 into R0.
#define CRC4 \
	CRC32CX R3, R0 \
	CRC32CX R4, R0 \
	CRC32CX R5, R0 \
	CRC32CX R6, R0

// func crcARM64(crc uint32, p *byte, n int) uint32
TEXT ·crcARM64(SB), NOSPLIT, $0-28
	MOVWU crc+0(FP), R0
	MOVD  p+8(FP), R1
	MOVD  n+16(FP), R2

loop32:
	CMP     $32, R2
	BLT     tail16
	LDP.P   16(R1), (R3, R4)
	LDP.P   16(R1), (R5, R6)
	CRC4
	SUB     $32, R2
	B       loop32

tail16:
	TBZ     $4, R2, tail8
	LDP.P   16(R1), (R3, R4)
	CRC32CX R3, R0
	CRC32CX R4, R0

tail8:
	TBZ     $3, R2, tail4
	MOVD.P  8(R1), R3
	CRC32CX R3, R0

tail4:
	TBZ     $2, R2, tail2
	MOVWU.P 4(R1), R3
	CRC32CW R3, R0

tail2:
	TBZ     $1, R2, tail1
	MOVHU.P 2(R1), R3
	CRC32CH R3, R0

tail1:
	TBZ     $0, R2, done
	MOVBU   (R1), R3
	CRC32CB R3, R0

done:
	MOVW R0, ret+24(FP)
	RET

// crcARM64Copy is crcARM64 over src that also copies src[0:n] to
// dst[0:n], each word stored from the register it is checksummed from.
//
// func crcARM64Copy(crc uint32, dst, src *byte, n int) uint32
TEXT ·crcARM64Copy(SB), NOSPLIT, $0-36
	MOVWU crc+0(FP), R0
	MOVD  dst+8(FP), R7
	MOVD  src+16(FP), R1
	MOVD  n+24(FP), R2

cloop32:
	CMP     $32, R2
	BLT     ctail16
	LDP.P   16(R1), (R3, R4)
	LDP.P   16(R1), (R5, R6)
	STP.P   (R3, R4), 16(R7)
	STP.P   (R5, R6), 16(R7)
	CRC4
	SUB     $32, R2
	B       cloop32

ctail16:
	TBZ     $4, R2, ctail8
	LDP.P   16(R1), (R3, R4)
	STP.P   (R3, R4), 16(R7)
	CRC32CX R3, R0
	CRC32CX R4, R0

ctail8:
	TBZ     $3, R2, ctail4
	MOVD.P  8(R1), R3
	MOVD.P  R3, 8(R7)
	CRC32CX R3, R0

ctail4:
	TBZ     $2, R2, ctail2
	MOVWU.P 4(R1), R3
	MOVW.P  R3, 4(R7)
	CRC32CW R3, R0

ctail2:
	TBZ     $1, R2, ctail1
	MOVHU.P 2(R1), R3
	MOVH.P  R3, 2(R7)
	CRC32CH R3, R0

ctail1:
	TBZ     $0, R2, cdone
	MOVBU   (R1), R3
	MOVB    R3, (R7)
	CRC32CB R3, R0

cdone:
	MOVW R0, ret+32(FP)
	RET

// LOAD3 loads the next two quadwords of each of the three streams (R3,
// R5, R6) into R7-R8, R9-R10 and R11-R12; CRC3 folds them into the
// streams' registers R0, R1 and R2, interleaved so that three CRC32CX are
// in flight at once.
#define LOAD3 \
	LDP.P 16(R3), (R7, R8)   \
	LDP.P 16(R5), (R9, R10)  \
	LDP.P 16(R6), (R11, R12)

#define CRC3 \
	CRC32CX R7, R0  \
	CRC32CX R9, R1  \
	CRC32CX R11, R2 \
	CRC32CX R8, R0  \
	CRC32CX R10, R1 \
	CRC32CX R12, R2

// crcARM64x3 runs three independent CRC streams over p[0:k], p[k:2k] and
// p[2k:3k], so that three CRC32CX instructions are in flight at once.
// k must be a positive multiple of 16.
//
// func crcARM64x3(a, b, c uint32, p *byte, k int) (ra, rb, rc uint32)
TEXT ·crcARM64x3(SB), NOSPLIT, $0-44
	MOVWU a+0(FP), R0
	MOVWU b+4(FP), R1
	MOVWU c+8(FP), R2
	MOVD  p+16(FP), R3
	MOVD  k+24(FP), R4
	ADD   R4, R3, R5
	ADD   R4, R5, R6

x3loop:
	LOAD3
	CRC3
	SUBS    $16, R4, R4
	BNE     x3loop

	MOVW R0, ra+32(FP)
	MOVW R1, rb+36(FP)
	MOVW R2, rc+40(FP)
	RET

// crcARM64x3Copy is crcARM64x3 over src that also copies src[0:3k] to
// dst[0:3k].
//
// func crcARM64x3Copy(a, b, c uint32, dst, src *byte, k int) (ra, rb, rc uint32)
TEXT ·crcARM64x3Copy(SB), NOSPLIT, $0-52
	MOVWU a+0(FP), R0
	MOVWU b+4(FP), R1
	MOVWU c+8(FP), R2
	MOVD  dst+16(FP), R13
	MOVD  src+24(FP), R3
	MOVD  k+32(FP), R4
	ADD   R4, R3, R5
	ADD   R4, R5, R6
	ADD   R4, R13, R14
	ADD   R4, R14, R15

x3cloop:
	LOAD3
	STP.P   (R7, R8), 16(R13)
	STP.P   (R9, R10), 16(R14)
	STP.P   (R11, R12), 16(R15)
	CRC3
	SUBS    $16, R4, R4
	BNE     x3cloop

	MOVW R0, ra+40(FP)
	MOVW R1, rb+44(FP)
	MOVW R2, rc+48(FP)
	RET
