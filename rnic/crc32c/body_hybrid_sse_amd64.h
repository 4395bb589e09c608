// Body of crcPCLMULBlock and crcPCLMULBlockCopy (layout in fold_amd64.h): m
// in CX, block in SI. Leaves the stream CRCs in AX, BX, DX and the vector
// part's CRC in R13 for COMBINESSE. The including file defines LDX as for
// body_pclmul_amd64.h, and CSETUP, S3 and CADV as for
// body_hybrid_avx2_amd64.h.

	HSETUP($6)
	CSETUP
	LDX(0, X0)
	LDX(16, X1)
	LDX(32, X2)
	LDX(48, X3)
	MOVOU ·kFold512(SB), X15
	ADDQ  $64, SI
	S3(0)
	S3(8)
	S3(16)
	S3(24)
	S3(32)
	S3(40)
	ADDQ  $48, R8
	CADV
	DECQ  CX
	JZ    done

loop:
	LDX(0, X8)
	LDX(16, X9)
	LDX(32, X10)
	LDX(48, X11)
	FOLD(X0, X4, X15)
	PXOR X8, X0
	S3(0)
	S3(8)
	FOLD(X1, X5, X15)
	PXOR X9, X1
	S3(16)
	S3(24)
	FOLD(X2, X6, X15)
	PXOR X10, X2
	S3(32)
	FOLD(X3, X7, X15)
	PXOR X11, X3
	S3(40)
	ADDQ $64, SI
	ADDQ $48, R8
	CADV
	DECQ CX
	JNZ  loop

done:
	MERGE4
	REDUCE(X3, R10, R8, R13)
