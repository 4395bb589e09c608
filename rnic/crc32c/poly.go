package crc32c

// Polynomial arithmetic modulo the Castagnoli polynomial, in the reflected
// representation used by the CRC register itself: bit 31 holds the
// coefficient of x^0 and bit 0 the coefficient of x^31. These helpers run
// only at init time (to build tables) and in tests (to check the folding
// constants in the assembly).

// poly is the reflected Castagnoli polynomial 0x1EDC6F41 (x^32 term implied).
const poly = 0x82F63B78

// mulX returns v·x mod P.
func mulX(v uint32) uint32 {
	if v&1 != 0 {
		return v>>1 ^ poly
	}
	return v >> 1
}

// mulMod returns a·b mod P.
func mulMod(a, b uint32) uint32 {
	var r uint32
	for i := 0; i < 32; i++ {
		if a&(0x80000000>>i) != 0 {
			r ^= b // add b·x^i
		}
		b = mulX(b)
	}
	return r
}

// xPow returns x^n mod P.
func xPow(n uint64) uint32 {
	r := uint32(0x80000000) // 1
	b := uint32(0x40000000) // x
	for ; n != 0; n >>= 1 {
		if n&1 != 0 {
			r = mulMod(r, b)
		}
		b = mulMod(b, b)
	}
	return r
}

// shiftTable maps a raw CRC register to the register after k zero bytes,
// one byte of the register at a time: shift(r) = r·x^(8k) mod P.
type shiftTable [4][256]uint32

func makeShiftTable(k int) *shiftTable {
	t := new(shiftTable)
	m := xPow(8 * uint64(k))
	for b := 0; b < 4; b++ {
		for i := 0; i < 256; i++ {
			t[b][i] = mulMod(uint32(i)<<(8*b), m)
		}
	}
	return t
}

func (t *shiftTable) shift(r uint32) uint32 {
	return t[0][r&0xFF] ^ t[1][r>>8&0xFF] ^ t[2][r>>16&0xFF] ^ t[3][r>>24]
}
