// Body of crcPCLMUL and crcPCLMULCopy: CRC register in AX, source in SI,
// length in CX (a multiple of 16, at least 64). The including file defines
// LDX(off, r): load the 16 bytes at off(SI) into r (and, copying, store them
// at off(SI)(R10*1)).

	LDX(0, X0)
	LDX(16, X1)
	LDX(32, X2)
	LDX(48, X3)
	MOVL  AX, X4
	PXOR  X4, X0
	ADDQ  $64, SI
	SUBQ  $64, CX
	MOVOU ·kFold512(SB), X15
	CMPQ  CX, $64
	JB    merge

loop64:
	LDX(0, X8)
	LDX(16, X9)
	LDX(32, X10)
	LDX(48, X11)
	FOLD(X0, X4, X15)
	FOLD(X1, X5, X15)
	FOLD(X2, X6, X15)
	FOLD(X3, X7, X15)
	PXOR X8, X0
	PXOR X9, X1
	PXOR X10, X2
	PXOR X11, X3
	ADDQ $64, SI
	SUBQ $64, CX
	CMPQ CX, $64
	JAE  loop64

merge:
	MERGE4

loop16:
	CMPQ CX, $16
	JB   reduce
	LDX(0, X8)
	FOLD(X3, X4, X15)
	PXOR X8, X3
	ADDQ $16, SI
	SUBQ $16, CX
	JMP  loop16

reduce:
	REDUCE(X3, BX, DX, AX)
