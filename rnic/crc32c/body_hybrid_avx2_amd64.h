// Body of crcAVX2Block and crcAVX2BlockCopy (layout in fold_amd64.h): m in
// CX, block in SI. Leaves the stream CRCs in AX, BX, DX and the vector
// part's CRC in R13 for COMBINE. The including file defines LDY, LOAD4 and
// D0..D3 as for body_avx2_amd64.h, plus
//
//	CSETUP   nothing, or (copying) R12 = destination of stream a
//	S3(off)  CRC3(off), or (copying) CRC3COPY(off)
//	CADV     nothing, or (copying) advance R12 by one iteration

	HSETUP($7)
	CSETUP
	LDY(0, Y0)
	LDY(32, Y1)
	LDY(64, Y2)
	LDY(96, Y3)
	VBROADCASTI128 ·kFold1024(SB), Y15
	ADDQ           $128, SI
	S3(0)
	S3(8)
	S3(16)
	S3(24)
	S3(32)
	S3(40)
	ADDQ           $48, R8
	CADV
	DECQ           CX
	JZ             done

loop:
	LOAD4
	VFOLD(Y0, Y4, Y15, D0)
	S3(0)
	S3(8)
	VFOLD(Y1, Y5, Y15, D1)
	S3(16)
	S3(24)
	VFOLD(Y2, Y6, Y15, D2)
	S3(32)
	VFOLD(Y3, Y7, Y15, D3)
	S3(40)
	ADDQ $128, SI
	ADDQ $48, R8
	CADV
	DECQ CX
	JNZ  loop

done:
	VBROADCASTI128 ·kFold512(SB), Y15
	VFOLD(Y0, Y4, Y15, Y2)
	VFOLD(Y1, Y5, Y15, Y3)
	VBROADCASTI128 ·kFold256(SB), Y15
	VFOLD(Y0, Y4, Y15, Y1)
	YTOX
	VREDUCE(X0, R10, R8, R13)
