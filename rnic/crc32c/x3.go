//go:build amd64 || arm64

package crc32c

import "unsafe"

// The CRC32-instruction kernels (amd64's "sse42", arm64's "arm64-crc32")
// checksum long inputs in three streams over consecutive blocks of k
// bytes, so that three of the instructions, each with a latency of about
// three cycles at one per cycle, are in flight at once, and join them with
// shift tables (the CRC of k zero bytes, poly.go):
//
//	CRC(I, ABC) = shift(shift(CRC(I, A)) ^ CRC(0, B)) ^ CRC(0, C)
//
// Two block sizes keep both ~4 KiB and ~512-byte inputs in the 3-way path.
// Both are multiples of 16, as the assembly loops need.
const (
	x3BigK   = 1360 // 3*1360 = 4080 bytes per round
	x3SmallK = 160  // 3*160 = 480 bytes per round
)

var (
	x3BigShift   = makeShiftTable(x3BigK)
	x3SmallShift = makeShiftTable(x3SmallK)
)

// x3Funcs are one architecture's assembly for the three-stream path: x3
// checksums p[0:k], p[k:2k] and p[2k:3k] from the registers a, b and c;
// one checksums p[0:n] in one stream, for what is left. The Copy variants
// also copy src to dst. All take and return raw registers.
type x3Funcs struct {
	x3      func(a, b, c uint32, p *byte, k int) (ra, rb, rc uint32)
	x3Copy  func(a, b, c uint32, dst, src *byte, k int) (ra, rb, rc uint32)
	one     func(crc uint32, p *byte, n int) uint32
	oneCopy func(crc uint32, dst, src *byte, n int) uint32
}

func (f *x3Funcs) update(crc uint32, p []byte) uint32 {
	r := ^crc
	for len(p) >= 3*x3BigK {
		a, b, c := f.x3(r, 0, 0, unsafe.SliceData(p), x3BigK)
		r = x3BigShift.shift(x3BigShift.shift(a)^b) ^ c
		p = p[3*x3BigK:]
	}
	for len(p) >= 3*x3SmallK {
		a, b, c := f.x3(r, 0, 0, unsafe.SliceData(p), x3SmallK)
		r = x3SmallShift.shift(x3SmallShift.shift(a)^b) ^ c
		p = p[3*x3SmallK:]
	}
	return ^f.one(r, unsafe.SliceData(p), len(p))
}

func (f *x3Funcs) updateCopy(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	r := ^crc
	for len(src) >= 3*x3BigK {
		a, b, c := f.x3Copy(r, 0, 0, unsafe.SliceData(dst), unsafe.SliceData(src), x3BigK)
		r = x3BigShift.shift(x3BigShift.shift(a)^b) ^ c
		dst, src = dst[3*x3BigK:], src[3*x3BigK:]
	}
	for len(src) >= 3*x3SmallK {
		a, b, c := f.x3Copy(r, 0, 0, unsafe.SliceData(dst), unsafe.SliceData(src), x3SmallK)
		r = x3SmallShift.shift(x3SmallShift.shift(a)^b) ^ c
		dst, src = dst[3*x3SmallK:], src[3*x3SmallK:]
	}
	return ^f.oneCopy(r, unsafe.SliceData(dst), unsafe.SliceData(src), len(src))
}

// kernel returns f as the kernel called name.
func (f *x3Funcs) kernel(name string) kernel {
	return kernel{name: name, update: f.update, updateCopy: f.updateCopy}
}
