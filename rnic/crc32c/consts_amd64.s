#include "textflag.h"

// Folding constants for the PCLMULQDQ kernels. Each 16-byte constant folds
// a 128-bit chunk forward by D bits: the low quadword is x^(D+31) mod P and
// multiplies the chunk's low quadword (the first 8 bytes, higher degree), the
// high quadword is x^(D-33) mod P and multiplies its high quadword. Values
// are in the reflected 32-bit CRC representation; the extra -1 in both
// exponents (64+D-33, D-33) compensates the x that PCLMULQDQ adds to a
// product of two reflected operands. TestAsmConstants recomputes them.

DATA ·kFold128+0(SB)/8, $0xf20c0dfe
DATA ·kFold128+8(SB)/8, $0x493c7d27
GLOBL ·kFold128(SB), RODATA|NOPTR, $16

DATA ·kFold256+0(SB)/8, $0x3da6d0cb
DATA ·kFold256+8(SB)/8, $0xba4fc28e
GLOBL ·kFold256(SB), RODATA|NOPTR, $16

DATA ·kFold512+0(SB)/8, $0x740eef02
DATA ·kFold512+8(SB)/8, $0x9e4addf8
GLOBL ·kFold512(SB), RODATA|NOPTR, $16

DATA ·kFold1024+0(SB)/8, $0x6992cea2
DATA ·kFold1024+8(SB)/8, $0x0d3b6092
GLOBL ·kFold1024(SB), RODATA|NOPTR, $16

DATA ·kFold2048+0(SB)/8, $0xdcb17aa4
DATA ·kFold2048+8(SB)/8, $0xb9e02b86
GLOBL ·kFold2048(SB), RODATA|NOPTR, $16

// kReduce512 folds the first three 128-bit lanes of a zmm register onto
// the fourth: lane i holds the constants for D = 384, 256, 128, lane 3 is
// zero (that lane is added unchanged).
DATA ·kReduce512+0(SB)/8, $0x1c291d04
DATA ·kReduce512+8(SB)/8, $0xddc0152b
DATA ·kReduce512+16(SB)/8, $0x3da6d0cb
DATA ·kReduce512+24(SB)/8, $0xba4fc28e
DATA ·kReduce512+32(SB)/8, $0xf20c0dfe
DATA ·kReduce512+40(SB)/8, $0x493c7d27
DATA ·kReduce512+48(SB)/8, $0
DATA ·kReduce512+56(SB)/8, $0
GLOBL ·kReduce512(SB), RODATA|NOPTR, $64
