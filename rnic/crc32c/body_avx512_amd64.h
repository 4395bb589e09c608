// Body of crcAVX512 and crcAVX512Copy: CRC register in AX, source in SI,
// length in CX (a multiple of 64, at least 64). The including file defines
//
//	LDZ(off, r)    load the 64 bytes at off(SI) into r (copying: and store
//	               them at off(SI)(R10*1))
//	LOAD4, LOAD1   nothing, or (copying) LDZ of the next 256 or 64 bytes
//	               into Z8..Z11
//	D0..D3         the data operands of the main loop: the memory itself,
//	               or (copying) Z8..Z11

	VMOVD AX, X4
	CMPQ  CX, $512
	JB    one

	// Four accumulators, 256 bytes per iteration.
	LDZ(0, Z0)
	LDZ(64, Z1)
	LDZ(128, Z2)
	LDZ(192, Z3)
	VPXORQ          Z4, Z0, Z0
	ADDQ            $256, SI
	SUBQ            $256, CX
	VBROADCASTI32X4 ·kFold2048(SB), Z15

loop256:
	LOAD4
	ZFOLD(Z0, Z4, Z15, D0)
	ZFOLD(Z1, Z5, Z15, D1)
	ZFOLD(Z2, Z6, Z15, D2)
	ZFOLD(Z3, Z7, Z15, D3)
	ADDQ $256, SI
	SUBQ $256, CX
	CMPQ CX, $256
	JAE  loop256

	VBROADCASTI32X4 ·kFold1024(SB), Z15
	ZFOLD(Z0, Z4, Z15, Z2)
	ZFOLD(Z1, Z5, Z15, Z3)
	VBROADCASTI32X4 ·kFold512(SB), Z15
	ZFOLD(Z0, Z4, Z15, Z1)
	JMP             loop64

one:
	LDZ(0, Z0)
	VPXORQ          Z4, Z0, Z0
	ADDQ            $64, SI
	SUBQ            $64, CX
	VBROADCASTI32X4 ·kFold512(SB), Z15

loop64:
	CMPQ CX, $64
	JB   reduce
	LOAD1
	ZFOLD(Z0, Z4, Z15, D0)
	ADDQ $64, SI
	SUBQ $64, CX
	JMP  loop64

reduce:
	ZTOX
	VREDUCE(X0, BX, DX, AX)
	VZEROUPPER
