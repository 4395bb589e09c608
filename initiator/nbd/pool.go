package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from size classes of powers of two from 4 KiB to
// 32 MiB; larger ones are allocated and left to the garbage collector.
const (
	minClassShift = 12
	maxClassShift = 25
)

// bufPool recycles payload buffers. Each connection has its own (no
// package-level state).
type bufPool struct {
	classes [maxClassShift - minClassShift + 1]sync.Pool
}

// class returns the size class index for n bytes, or -1 if n is too large
// to pool.
func class(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	shift := bits.Len(uint(n - 1)) // smallest power of two >= n
	if shift > maxClassShift {
		return -1
	}
	return shift - minClassShift
}

// get returns a buffer of length n.
func (p *bufPool) get(n int) *[]byte {
	c := class(n)
	if c < 0 {
		b := make([]byte, n)
		return &b
	}
	if v, ok := p.classes[c].Get().(*[]byte); ok {
		*v = (*v)[:n]
		return v
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

// put recycles a buffer from get.
func (p *bufPool) put(b *[]byte) {
	if b == nil {
		return
	}
	c := class(cap(*b))
	if c < 0 || cap(*b) != 1<<(c+minClassShift) {
		return
	}
	p.classes[c].Put(b)
}
