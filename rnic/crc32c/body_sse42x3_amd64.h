// Body of crcSSE42x3 and crcSSE42x3Copy: three CRC streams in AX, BX and DX
// over k bytes each at SI, DI and R8 (k in CX, a positive multiple of 16).
// The including file defines CRCQ3(off): add the quadwords at off(SI),
// off(DI) and off(R8) to AX, BX and DX (and, copying, store each at the
// same address plus R10).

	ADDQ SI, CX // end of stream a

loop:
	CRCQ3(0)
	CRCQ3(8)
	ADDQ $16, SI
	ADDQ $16, DI
	ADDQ $16, R8
	CMPQ SI, CX
	JB   loop
