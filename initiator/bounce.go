package initiator

import (
	"context"
	"fmt"
	"math/bits"
	"sync"

	"github.com/rnic-dev/rnic/rnic"
)

// bbuf is a registered staging buffer: the source of RDMA Writes and the
// sink of RDMA Reads, so a caller's memory is never handed to the RNIC (a
// cancelled request cannot leave the RNIC writing into it).
type bbuf struct {
	b   []byte
	mr  *rnic.MR
	cls int
}

func (b *bbuf) sge(n int) rnic.SGE { return rnic.SGE{STag: b.mr.STag(), Len: uint32(n)} }

// bouncePool keeps registered buffers in power-of-two classes (4 KiB up to
// the session's max transfer) within a byte budget; buffers are registered
// once and reused.
type bouncePool struct {
	pd     *rnic.PD
	mu     sync.Mutex
	cond   *sync.Cond
	free   [][]*bbuf
	all    []*bbuf
	budget int64
	used   int64
	closed bool
}

const bounceMinShift = 12

func newBouncePool(pd *rnic.PD, maxSize int, budget int64) *bouncePool {
	n := bits.Len(uint(maxSize-1)) - bounceMinShift + 1
	p := &bouncePool{pd: pd, free: make([][]*bbuf, max(n, 1)), budget: max(budget, int64(maxSize))}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// get returns a buffer of at least n bytes, waiting for memory (or ctx)
// if the budget is used up.
func (p *bouncePool) get(ctx context.Context, n int) (*bbuf, error) {
	s := max(bits.Len(uint(max(n, 1)-1)), bounceMinShift)
	c := s - bounceMinShift
	if c >= len(p.free) {
		return nil, fmt.Errorf("%w: %d bytes exceed the largest transfer", ErrInvalid, n)
	}
	size := 1 << s
	p.mu.Lock()
	defer p.mu.Unlock()
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		if p.closed {
			return nil, errConnLost
		}
		if b, err := p.takeLocked(c, size); b != nil || err != nil {
			return b, err
		}
		if p.dropFreeLocked(size) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if stop == nil { // only a waiter pays for the wake-up on cancellation
			stop = context.AfterFunc(ctx, func() {
				p.mu.Lock()
				p.cond.Broadcast()
				p.mu.Unlock()
			})
		}
		p.cond.Wait()
	}
}

// tryGet returns a buffer of at least n bytes if one is free or fits the
// budget now, else nil; it never waits.
func (p *bouncePool) tryGet(n int) *bbuf {
	s := max(bits.Len(uint(max(n, 1)-1)), bounceMinShift)
	c := s - bounceMinShift
	if c >= len(p.free) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	b, _ := p.takeLocked(c, 1<<s)
	return b
}

// takeLocked returns a free buffer of class c, or a new one of size bytes
// if it fits the budget; nil (and no error) if neither.
func (p *bouncePool) takeLocked(c, size int) (*bbuf, error) {
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c] = p.free[c][:l-1]
		return b, nil
	}
	if p.used+int64(size) > p.budget {
		return nil, nil
	}
	buf := make([]byte, size)
	// Remote Write: the verbs check it on the sink of an RDMA Read when
	// the Read Response arrives (draft-hilland §7.4.2); the target is the
	// only peer of the session's QPs.
	mr, err := p.pd.RegisterBytes(buf, rnic.LocalRead|rnic.LocalWrite|rnic.RemoteWrite)
	if err != nil {
		return nil, fmt.Errorf("initiator: registering a staging buffer: %w", err)
	}
	p.used += int64(size)
	b := &bbuf{b: buf, mr: mr, cls: c}
	p.all = append(p.all, b)
	return b, nil
}

// dropFreeLocked deregisters cached buffers of other classes until size
// more bytes fit the budget; it reports whether they do.
func (p *bouncePool) dropFreeLocked(size int) bool {
	for i := len(p.free) - 1; i >= 0 && p.used+int64(size) > p.budget; i-- {
		for len(p.free[i]) > 0 && p.used+int64(size) > p.budget {
			l := len(p.free[i])
			b := p.free[i][l-1]
			p.free[i] = p.free[i][:l-1]
			b.mr.Dealloc()
			p.used -= int64(len(b.b))
			for k, x := range p.all {
				if x == b {
					p.all[k] = p.all[len(p.all)-1]
					p.all = p.all[:len(p.all)-1]
					break
				}
			}
		}
	}
	return p.used+int64(size) <= p.budget
}

// put returns a buffer.
func (p *bouncePool) put(b *bbuf) {
	if b == nil {
		return
	}
	p.mu.Lock()
	p.free[b.cls] = append(p.free[b.cls], b)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// close deregisters every buffer (the session's QPs are gone) and fails
// waiters.
func (p *bouncePool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, b := range p.all {
		b.mr.Dealloc()
	}
	p.all = nil
	p.free = make([][]*bbuf, len(p.free))
	p.cond.Broadcast()
}
