package endpoint

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
)

// Pool hands out data buffers in power-of-two size classes, within a byte
// budget that counts every buffer it allocated and still holds (in use or
// cached). When the budget is used up, a request first drops cached
// buffers of other classes, then waits for a release. Buffers are plain
// memory: a protocol maps the part it exposes with a Fast-Register work
// request when it advertises it. Safe for concurrent use.
type Pool struct {
	mu       sync.Mutex
	free     [][][]byte // per class
	minShift uint
	budget   int64
	used     int64 // bytes allocated and not dropped
	waiters  int
	wake     chan struct{} // closed and replaced by put when waiters > 0
}

// NewPool returns a pool of buffers from minSize to maxSize bytes (each
// rounded up to a power of two) within budget bytes.
func NewPool(minSize, maxSize int, budget int64) *Pool {
	minShift := uint(bits.Len(uint(minSize - 1)))
	maxShift := uint(bits.Len(uint(maxSize - 1)))
	return &Pool{free: make([][][]byte, maxShift-minShift+1), minShift: minShift, budget: budget,
		wake: make(chan struct{})}
}

// class returns the class index and size for n bytes (ok false if too big).
func (p *Pool) class(n int) (int, int, bool) {
	s := uint(bits.Len(uint(max(n, 1) - 1)))
	if s < p.minShift {
		s = p.minShift
	}
	c := int(s - p.minShift)
	if c >= len(p.free) {
		return 0, 0, false
	}
	return c, 1 << s, true
}

// TryGet returns a buffer of at least n bytes (its length is the class
// size), or nil if the budget does not allow one now.
func (p *Pool) TryGet(n int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tryGetLocked(n)
}

func (p *Pool) tryGetLocked(n int) []byte {
	c, size, ok := p.class(n)
	if !ok {
		return nil
	}
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c][l-1] = nil
		p.free[c] = p.free[c][:l-1]
		return b
	}
	for i := len(p.free) - 1; i >= 0 && p.used+int64(size) > p.budget; i-- {
		for len(p.free[i]) > 0 && p.used+int64(size) > p.budget {
			l := len(p.free[i])
			p.used -= int64(len(p.free[i][l-1]))
			p.free[i][l-1] = nil
			p.free[i] = p.free[i][:l-1]
		}
	}
	if p.used+int64(size) > p.budget {
		return nil
	}
	p.used += int64(size)
	return make([]byte, size)
}

// Get waits for a buffer of at least n bytes (its length is the class
// size) until ctx ends.
func (p *Pool) Get(ctx context.Context, n int) ([]byte, error) {
	if _, size, ok := p.class(n); !ok || int64(size) > p.budget {
		return nil, fmt.Errorf("endpoint: buffer of %d bytes exceeds the pool", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if b := p.tryGetLocked(n); b != nil {
			return b, nil
		}
		p.waiters++
		wake := p.wake
		p.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = fmt.Errorf("endpoint: waiting for buffer memory: %w", ctx.Err())
		}
		p.mu.Lock()
		p.waiters--
		if err != nil {
			return nil, err
		}
	}
}

// Put returns a buffer obtained from Get or TryGet (nil: nothing).
func (p *Pool) Put(b []byte) {
	if b == nil {
		return
	}
	c, _, ok := p.class(cap(b))
	p.mu.Lock()
	if ok {
		p.free[c] = append(p.free[c], b[:cap(b)])
	}
	if p.waiters > 0 {
		close(p.wake)
		p.wake = make(chan struct{})
	}
	p.mu.Unlock()
}

// InUse reports the bytes allocated and not dropped: buffers in use and
// cached.
func (p *Pool) InUse() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}
