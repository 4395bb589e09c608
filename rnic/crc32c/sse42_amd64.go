package crc32c

import "unsafe"

// The CRC32-instruction kernel runs three streams over consecutive blocks
// of k bytes and joins them with shift tables (crc of k zero bytes):
//
//	CRC(I, ABC) = shift(shift(CRC(I, A)) ^ CRC(0, B)) ^ CRC(0, C)
//
// Two block sizes keep both ~4 KiB and ~512-byte inputs in the 3-way path.
const (
	sse42BigK   = 1360 // 3*1360 = 4080 bytes per round
	sse42SmallK = 160  // 3*160 = 480 bytes per round
)

var (
	sse42BigShift   = makeShiftTable(sse42BigK)
	sse42SmallShift = makeShiftTable(sse42SmallK)
)

func sse42Update(crc uint32, p []byte) uint32 {
	r := ^crc
	for len(p) >= 3*sse42BigK {
		a, b, c := crcSSE42x3(r, 0, 0, unsafe.SliceData(p), sse42BigK)
		r = sse42BigShift.shift(sse42BigShift.shift(a)^b) ^ c
		p = p[3*sse42BigK:]
	}
	for len(p) >= 3*sse42SmallK {
		a, b, c := crcSSE42x3(r, 0, 0, unsafe.SliceData(p), sse42SmallK)
		r = sse42SmallShift.shift(sse42SmallShift.shift(a)^b) ^ c
		p = p[3*sse42SmallK:]
	}
	return ^crcSSE42(r, unsafe.SliceData(p), len(p))
}

func sse42UpdateCopy(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	r := ^crc
	for len(src) >= 3*sse42BigK {
		a, b, c := crcSSE42x3Copy(r, 0, 0, unsafe.SliceData(dst), unsafe.SliceData(src), sse42BigK)
		r = sse42BigShift.shift(sse42BigShift.shift(a)^b) ^ c
		dst, src = dst[3*sse42BigK:], src[3*sse42BigK:]
	}
	for len(src) >= 3*sse42SmallK {
		a, b, c := crcSSE42x3Copy(r, 0, 0, unsafe.SliceData(dst), unsafe.SliceData(src), sse42SmallK)
		r = sse42SmallShift.shift(sse42SmallShift.shift(a)^b) ^ c
		dst, src = dst[3*sse42SmallK:], src[3*sse42SmallK:]
	}
	return ^crcSSE42Copy(r, unsafe.SliceData(dst), unsafe.SliceData(src), len(src))
}
