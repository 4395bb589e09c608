package crc32c

import (
	"hash/crc32"
	"testing"
)

var benchSizes = []struct {
	name string
	n    int
}{
	{"64B", 64}, {"512B", 512}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20},
}

func benchData(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*131 + i>>8)
	}
	return p
}

var sink uint32

func BenchmarkUpdate(b *testing.B) {
	for _, k := range kernels {
		for _, s := range benchSizes {
			b.Run(k.name+"/"+s.name, func(b *testing.B) {
				p := benchData(s.n)
				b.SetBytes(int64(s.n))
				var c uint32
				for b.Loop() {
					c = k.update(c, p)
				}
				sink = c
			})
		}
	}
	for _, s := range benchSizes {
		b.Run("hash-crc32/"+s.name, func(b *testing.B) {
			p := benchData(s.n)
			b.SetBytes(int64(s.n))
			var c uint32
			for b.Loop() {
				c = crc32.Update(c, castagnoli, p)
			}
			sink = c
		})
	}
}

func BenchmarkUpdateCopy(b *testing.B) {
	for _, k := range kernels {
		for _, s := range benchSizes {
			b.Run(k.name+"/"+s.name, func(b *testing.B) {
				src, dst := benchData(s.n), make([]byte, s.n)
				b.SetBytes(int64(s.n))
				var c uint32
				for b.Loop() {
					c = k.updateCopy(c, dst, src)
				}
				sink = c
			})
		}
	}
	for _, s := range benchSizes {
		b.Run("copy+hash-crc32/"+s.name, func(b *testing.B) {
			src, dst := benchData(s.n), make([]byte, s.n)
			b.SetBytes(int64(s.n))
			var c uint32
			for b.Loop() {
				copy(dst, src)
				c = crc32.Update(c, castagnoli, src)
			}
			sink = c
		})
	}
}
