package nbd

import (
	"context"
	"sync"
)

// budget is a counting semaphore over bytes with a single acquirer (the
// connection's reader) and any number of releasers.
type budget struct {
	mu    sync.Mutex
	avail int64
	wake  chan struct{} // signalled (without blocking) on every release
}

func newBudget(n int64) *budget {
	return &budget{avail: n, wake: make(chan struct{}, 1)}
}

// acquire takes n bytes, waiting until they are available or ctx is done.
// n must not exceed the budget's total.
func (b *budget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.avail >= n {
			b.avail -= n
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock()
		select {
		case <-b.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryAcquire takes n bytes if they are available now.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.avail >= n {
		b.avail -= n
		return true
	}
	return false
}

// release returns n bytes.
func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.avail += n
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}
