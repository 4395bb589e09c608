package nvmf

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
)

// buffers hands out data buffers of 4 KiB to 1 MiB, in power-of-two
// sizes, reused through one sync.Pool per size. Their total size in use is
// bounded: a request waits until enough is given back, so hosts with deep
// queues of large transfers queue here instead of growing the heap.
type buffers struct {
	pools [maxClass - minClass + 1]sync.Pool

	mu      sync.Mutex
	inUse   int64
	limit   int64
	changed chan struct{} // closed and replaced when inUse drops and someone waits
	waiting int
}

const (
	minClass = 12 // 4 KiB
	maxClass = 20 // 1 MiB
)

func newBuffers(limit int64) *buffers {
	b := &buffers{limit: limit, changed: make(chan struct{})}
	for i := range b.pools {
		size := 1 << (minClass + i)
		b.pools[i].New = func() any { return make([]byte, size) }
	}
	return b
}

// classOf returns the pool index and buffer size for n bytes.
func classOf(n int) (int, int) {
	c := max(bits.Len(uint(max(n, 1)-1)), minClass)
	return c - minClass, 1 << c
}

// get returns a buffer of n bytes (n <= 1 MiB), waiting for room under the
// limit until ctx ends.
func (b *buffers) get(ctx context.Context, n int) ([]byte, error) {
	if n > 1<<maxClass {
		return nil, fmt.Errorf("nvmf: buffer of %d bytes, at most %d", n, 1<<maxClass)
	}
	c, size := classOf(n)
	b.mu.Lock()
	for b.inUse+int64(size) > b.limit {
		ch := b.changed
		b.waiting++
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			b.mu.Lock()
			b.waiting--
			b.mu.Unlock()
			return nil, fmt.Errorf("nvmf: waiting for buffer memory: %w", ctx.Err())
		}
		b.mu.Lock()
		b.waiting--
	}
	b.inUse += int64(size)
	b.mu.Unlock()
	buf := b.pools[c].Get().([]byte)
	return buf[:n], nil
}

// tryGet returns a buffer of n bytes if the limit allows one now, else
// nil.
func (b *buffers) tryGet(n int) []byte {
	if n > 1<<maxClass {
		return nil
	}
	c, size := classOf(n)
	b.mu.Lock()
	if b.inUse+int64(size) > b.limit {
		b.mu.Unlock()
		return nil
	}
	b.inUse += int64(size)
	b.mu.Unlock()
	return b.pools[c].Get().([]byte)[:n]
}

// put gives back a buffer from get (nil is ignored).
func (b *buffers) put(buf []byte) {
	if buf == nil {
		return
	}
	c, size := classOf(cap(buf))
	b.pools[c].Put(buf[:cap(buf)])
	b.mu.Lock()
	b.inUse -= int64(size)
	if b.waiting > 0 {
		close(b.changed)
		b.changed = make(chan struct{})
	}
	b.mu.Unlock()
}

// used reports the bytes of buffers handed out and not given back.
func (b *buffers) used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse
}
