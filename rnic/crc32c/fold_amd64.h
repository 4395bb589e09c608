// Macros shared by the folding kernels. See consts_amd64.s for the fold
// constants: k holds x^(D+31) mod P in its low quadword (multiplies the
// first 8 bytes of each 128-bit chunk) and x^(D-33) mod P in its high
// quadword (multiplies the last 8 bytes), which moves the chunk D bits
// forward in the message.

// FOLD (SSE): acc = fold(acc, k); tmp is clobbered.
#define FOLD(acc, tmp, k) \
	MOVOA     acc, tmp      \
	PCLMULQDQ $0x00, k, acc \
	PCLMULQDQ $0x11, k, tmp \
	PXOR      tmp, acc

// MERGE4 (SSE) folds the four consecutive chunks X0..X3 into X3 (uses
// kFold128; clobbers X4-X6, X15).
#define MERGE4 \
	MOVOU ·kFold128(SB), X15 \
	FOLD(X0, X4, X15)        \
	PXOR  X0, X1             \
	FOLD(X1, X5, X15)        \
	PXOR  X1, X2             \
	FOLD(X2, X6, X15)        \
	PXOR  X2, X3

// VFOLD (AVX2, any width): acc = fold(acc, k) ^ data; data may be memory.
#define VFOLD(acc, tmp, k, data) \
	VPCLMULQDQ $0x00, k, acc, tmp \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPXOR      data, tmp, tmp     \
	VPXOR      tmp, acc, acc

// ZFOLD (AVX-512): acc = fold(acc, k) ^ data; data may be memory.
#define ZFOLD(acc, tmp, k, data) \
	VPCLMULQDQ $0x00, k, acc, tmp \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPTERNLOGQ $0x96, data, tmp, acc

// REDUCE turns the 128-bit remainder in x into a CRC register in out. The
// CRC32 of those 16 bytes from a zero register is x·x^32 mod P, exactly the
// register value, so two CRC32 instructions replace a Barrett reduction.
#define REDUCE(x, t1, t2, out) \
	MOVQ   x, t1     \
	PEXTRQ $1, x, t2 \
	XORL   out, out  \
	CRC32Q t1, out   \
	CRC32Q t2, out

// VREDUCE is REDUCE with VEX encoding.
#define VREDUCE(x, t1, t2, out) \
	VMOVQ   x, t1     \
	VPEXTRQ $1, x, t2 \
	XORL    out, out  \
	CRC32Q  t1, out   \
	CRC32Q  t2, out

// YTOX folds the low 128-bit lane of Y0 onto the high lane, into X0.
// Clobbers X1, X2, X15.
#define YTOX \
	VMOVDQU      ·kFold128(SB), X15 \
	VEXTRACTI128 $1, Y0, X1         \
	VPCLMULQDQ   $0x00, X15, X0, X2 \
	VPCLMULQDQ   $0x11, X15, X0, X0 \
	VPXOR        X2, X0, X0         \
	VPXOR        X1, X0, X0

// ZTOX folds lanes 0..2 of Z0 onto lane 3 with one pair of multiplications
// (per-lane constants in kReduce512), into X0. Clobbers Z1-Z3, Z15.
#define ZTOX \
	VMOVDQU64     ·kReduce512(SB), Z15 \
	VPCLMULQDQ    $0x00, Z15, Z0, Z1   \
	VPCLMULQDQ    $0x11, Z15, Z0, Z2   \
	VEXTRACTI32X4 $3, Z0, X3           \
	VPTERNLOGQ    $0x96, Z2, Z1, Z3    \
	VEXTRACTI64X4 $1, Z3, Y1           \
	VPXOR         Y1, Y3, Y3           \
	VEXTRACTI128  $1, Y3, X1           \
	VPXOR         X1, X3, X0

// Hybrid blocks. A block of m iterations is laid out as
//
//	[ vector: m·V bytes ][ stream a: S ][ stream b: S ][ stream c: S ]
//
// with S = 48m. The vector unit folds its part while three CRC32 streams
// (registers AX, BX, DX, all starting from zero) run over a, b and c,
// 48 bytes each per iteration. R8 points into stream a and R9 = S, so b
// and c are (R8)(R9*1) and (R8)(R9*2).

// HSETUP sets R9 = S and R8 = SI + m·V from CX = m (vshift = $log2(V)) and
// clears the stream registers.
#define HSETUP(vshift) \
	LEAQ (CX)(CX*2), R9 \
	SHLQ $4, R9         \
	MOVQ CX, R8         \
	SHLQ vshift, R8     \
	ADDQ SI, R8         \
	XORL AX, AX         \
	XORL BX, BX         \
	XORL DX, DX

// CRC3 advances the three streams by the quadword at offset off.
#define CRC3(off) \
	CRC32Q off(R8), AX       \
	CRC32Q off(R8)(R9*1), BX \
	CRC32Q off(R8)(R9*2), DX

// CRC3COPY is CRC3 that also stores each quadword at the same offset from
// R12 (the destination of stream a). Clobbers R11, R13, DI.
#define CRC3COPY(off) \
	MOVQ   off(R8), R11        \
	MOVQ   off(R8)(R9*1), R13  \
	MOVQ   off(R8)(R9*2), DI   \
	MOVQ   R11, off(R12)       \
	MOVQ   R13, off(R12)(R9*1) \
	MOVQ   DI, off(R12)(R9*2)  \
	CRC32Q R11, AX             \
	CRC32Q R13, BX             \
	CRC32Q DI, DX

// CRC3ITER advances the streams by one iteration.
#define CRC3ITER \
	CRC3(0)  \
	CRC3(8)  \
	CRC3(16) \
	CRC3(24) \
	CRC3(32) \
	CRC3(40)

// COMBINE joins a block's partial CRCs. With r the register before the
// block (in GPR r), v the vector part's CRC (GPR v) and k pointing at the
// block's multipliers {x^(8S-33), x^(16S-33), x^(24S-33), x^(8T-33)} mod P:
//
//	AX = reduce(r·K_T + v·K_3S + a·K_2S + b·K_S) ^ c
//
// A 32×32 carry-less product of two registers is (p·q·x) placed so that
// one CRC32 instruction from zero yields p·q·x^33 mod P, hence the -33.
// Clobbers X1-X8 and R10.
#define COMBINE(r, v, k) \
	VMOVD      r, X1               \
	VMOVD      12(k), X2           \
	VPCLMULQDQ $0x00, X2, X1, X1   \
	VMOVD      v, X3               \
	VMOVD      8(k), X4            \
	VPCLMULQDQ $0x00, X4, X3, X3   \
	VMOVD      AX, X5              \
	VMOVD      4(k), X6            \
	VPCLMULQDQ $0x00, X6, X5, X5   \
	VMOVD      BX, X7              \
	VMOVD      0(k), X8            \
	VPCLMULQDQ $0x00, X8, X7, X7   \
	VPXOR      X1, X3, X3          \
	VPXOR      X5, X7, X7          \
	VPXOR      X3, X7, X7          \
	VMOVQ      X7, R10             \
	XORL       AX, AX              \
	CRC32Q     R10, AX             \
	XORL       DX, AX

// COMBINESSE is COMBINE without VEX encoding.
#define COMBINESSE(r, v, k) \
	MOVL      r, X1          \
	MOVL      12(k), X2      \
	PCLMULQDQ $0x00, X2, X1  \
	MOVL      v, X3          \
	MOVL      8(k), X4       \
	PCLMULQDQ $0x00, X4, X3  \
	MOVL      AX, X5         \
	MOVL      4(k), X6       \
	PCLMULQDQ $0x00, X6, X5  \
	MOVL      BX, X7         \
	MOVL      0(k), X8       \
	PCLMULQDQ $0x00, X8, X7  \
	PXOR      X1, X3         \
	PXOR      X5, X7         \
	PXOR      X3, X7         \
	MOVQ      X7, R10        \
	XORL      AX, AX         \
	CRC32Q    R10, AX        \
	XORL      DX, AX
