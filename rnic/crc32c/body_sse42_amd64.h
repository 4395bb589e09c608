// Body of crcSSE42 and crcSSE42Copy: CRC register in AX, source in SI,
// length in CX. The including file defines, for the update or the copy
// variant:
//
//	CRCQ(off), CRCL(off), CRCW(off), CRCB(off): add the 8, 4, 2 or 1 bytes
//	at off(SI) to AX (and, copying, store them at off(SI)(R10*1)).

	CMPQ CX, $8
	JB   tail

loop8:
	CRCQ(0)
	ADDQ $8, SI
	SUBQ $8, CX
	CMPQ CX, $8
	JAE  loop8

tail:
	TESTQ $4, CX
	JZ    tail2
	CRCL(0)
	ADDQ  $4, SI

tail2:
	TESTQ $2, CX
	JZ    tail1
	CRCW(0)
	ADDQ  $2, SI

tail1:
	TESTQ $1, CX
	JZ    done
	CRCB(0)

done:
