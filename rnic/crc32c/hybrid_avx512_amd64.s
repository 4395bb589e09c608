#include "textflag.h"
#include "fold_amd64.h"

// Hybrid block for AVX-512 (layout in fold_amd64.h): each iteration folds
// 256 bytes in four zmm accumulators while three CRC32 streams advance 48
// bytes each. Takes and returns the raw CRC register; m >= 1.
//
// There is no copying variant: on the machines measured the copy is bound
// by the memory hierarchy, not by the multiplier, and crcAVX512Copy alone
// is as fast.

// func crcAVX512Block(crc uint32, p *byte, m int, k *[4]uint32) uint32
TEXT ·crcAVX512Block(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), R12
	MOVQ p+8(FP), SI
	MOVQ m+16(FP), CX
	MOVQ k+24(FP), R11
	HSETUP($8)

	VMOVDQU64       (SI), Z0
	VMOVDQU64       64(SI), Z1
	VMOVDQU64       128(SI), Z2
	VMOVDQU64       192(SI), Z3
	VBROADCASTI32X4 ·kFold2048(SB), Z15
	ADDQ            $256, SI
	CRC3ITER
	ADDQ            $48, R8
	DECQ            CX
	JZ              done

loop:
	ZFOLD(Z0, Z4, Z15, (SI))
	CRC3(0)
	CRC3(8)
	ZFOLD(Z1, Z5, Z15, 64(SI))
	CRC3(16)
	CRC3(24)
	ZFOLD(Z2, Z6, Z15, 128(SI))
	CRC3(32)
	ZFOLD(Z3, Z7, Z15, 192(SI))
	CRC3(40)
	ADDQ $256, SI
	ADDQ $48, R8
	DECQ CX
	JNZ  loop

done:
	VBROADCASTI32X4 ·kFold1024(SB), Z15
	ZFOLD(Z0, Z4, Z15, Z2)
	ZFOLD(Z1, Z5, Z15, Z3)
	VBROADCASTI32X4 ·kFold512(SB), Z15
	ZFOLD(Z0, Z4, Z15, Z1)
	ZTOX
	VREDUCE(X0, R10, R8, R13)
	COMBINE(R12, R13, R11)
	VZEROUPPER
	MOVL AX, ret+32(FP)
	RET
