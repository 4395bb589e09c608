package crc32c

// Portable slicing-by-8 implementation, used where no assembly kernel
// exists and as the reference-free fallback on old x86 CPUs.

// slice8 holds the slicing-by-8 tables: slice8[0] is the byte-at-a-time
// table, slice8[k][i] is the register after byte i followed by k zero bytes.
var slice8 = makeSlice8()

func makeSlice8() *[8][256]uint32 {
	t := new([8][256]uint32)
	for i := 0; i < 256; i++ {
		r := uint32(i)
		for j := 0; j < 8; j++ {
			r = mulX(r)
		}
		t[0][i] = r
	}
	for k := 1; k < 8; k++ {
		for i := 0; i < 256; i++ {
			r := t[k-1][i]
			t[k][i] = r>>8 ^ t[0][r&0xFF]
		}
	}
	return t
}

// genericRaw advances the raw (non-inverted) register r over p.
func genericRaw(r uint32, p []byte) uint32 {
	t := slice8
	for len(p) >= 8 {
		r ^= uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
		r = t[7][r&0xFF] ^ t[6][r>>8&0xFF] ^ t[5][r>>16&0xFF] ^ t[4][r>>24] ^
			t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
		p = p[8:]
	}
	for _, c := range p {
		r = r>>8 ^ t[0][byte(r)^c]
	}
	return r
}

func genericUpdate(crc uint32, p []byte) uint32 {
	return ^genericRaw(^crc, p)
}

// genericChunk is small enough that a chunk just copied is still in L1 when
// it is checksummed, so copy-then-CRC reads memory once.
const genericChunk = 4096

func genericUpdateCopy(crc uint32, dst, src []byte) uint32 {
	r := ^crc
	dst = dst[:len(src)]
	for len(src) > 0 {
		n := min(len(src), genericChunk)
		copy(dst[:n], src[:n])
		r = genericRaw(r, src[:n])
		dst, src = dst[n:], src[n:]
	}
	return ^r
}
