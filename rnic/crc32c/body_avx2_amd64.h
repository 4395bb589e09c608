// Body of crcAVX2 and crcAVX2Copy: CRC register in AX, source in SI, length
// in CX (a multiple of 32, at least 64). The including file defines
//
//	LDY(off, r)    load the 32 bytes at off(SI) into r (copying: and store
//	               them at off(SI)(R10*1))
//	LOAD4, LOAD1   nothing, or (copying) LDY of the next 128 or 32 bytes
//	               into Y8..Y11
//	D0..D3         the data operands of the main loop: the memory itself,
//	               or (copying) Y8..Y11

	VMOVD AX, X4
	CMPQ  CX, $256
	JB    one

	// Four accumulators, 128 bytes per iteration.
	LDY(0, Y0)
	LDY(32, Y1)
	LDY(64, Y2)
	LDY(96, Y3)
	VPXOR          Y4, Y0, Y0
	ADDQ           $128, SI
	SUBQ           $128, CX
	VBROADCASTI128 ·kFold1024(SB), Y15

loop128:
	LOAD4
	VFOLD(Y0, Y4, Y15, D0)
	VFOLD(Y1, Y5, Y15, D1)
	VFOLD(Y2, Y6, Y15, D2)
	VFOLD(Y3, Y7, Y15, D3)
	ADDQ $128, SI
	SUBQ $128, CX
	CMPQ CX, $128
	JAE  loop128

	VBROADCASTI128 ·kFold512(SB), Y15
	VFOLD(Y0, Y4, Y15, Y2)
	VFOLD(Y1, Y5, Y15, Y3)
	VBROADCASTI128 ·kFold256(SB), Y15
	VFOLD(Y0, Y4, Y15, Y1)
	JMP            loop32

one:
	LDY(0, Y0)
	VPXOR          Y4, Y0, Y0
	ADDQ           $32, SI
	SUBQ           $32, CX
	VBROADCASTI128 ·kFold256(SB), Y15

loop32:
	CMPQ CX, $32
	JB   reduce
	LOAD1
	VFOLD(Y0, Y4, Y15, D0)
	ADDQ $32, SI
	SUBQ $32, CX
	JMP  loop32

reduce:
	YTOX
	VREDUCE(X0, BX, DX, AX)
	VZEROUPPER
