package nbd

import (
	"context"
	"sync"
	"sync/atomic"
)

// memBackend is a Backend over a byte slice that counts the calls that
// matter for durability. hook, if set, runs before every operation; it
// may block, and an error it returns fails the operation.
type memBackend struct {
	mu   sync.RWMutex
	data []byte

	reads, writes, fuaWrites, flushes, trims, zeroes, fuaZeroes atomic.Int64

	hook func(ctx context.Context, op string, off, n int64) error
}

func newMem(size int64) *memBackend { return &memBackend{data: make([]byte, size)} }

func (m *memBackend) Size() int64 { return int64(len(m.data)) }

func (m *memBackend) call(ctx context.Context, op string, off, n int64) error {
	if m.hook != nil {
		return m.hook(ctx, op, off, n)
	}
	return nil
}

func (m *memBackend) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := m.call(ctx, "read", off, int64(len(p))); err != nil {
		return err
	}
	m.reads.Add(1)
	m.mu.RLock()
	copy(p, m.data[off:])
	m.mu.RUnlock()
	return nil
}

func (m *memBackend) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	if err := m.call(ctx, "write", off, int64(len(p))); err != nil {
		return err
	}
	m.writes.Add(1)
	if fua {
		m.fuaWrites.Add(1)
	}
	m.mu.Lock()
	copy(m.data[off:], p)
	m.mu.Unlock()
	return nil
}

func (m *memBackend) Flush(ctx context.Context) error {
	if err := m.call(ctx, "flush", 0, 0); err != nil {
		return err
	}
	m.flushes.Add(1)
	return nil
}

func (m *memBackend) Trim(ctx context.Context, off, n int64) error {
	if err := m.call(ctx, "trim", off, n); err != nil {
		return err
	}
	m.trims.Add(1)
	m.clear(off, n)
	return nil
}

// clear zeroes n bytes at off.
func (m *memBackend) clear(off, n int64) {
	m.mu.Lock()
	clear(m.data[off : off+n])
	m.mu.Unlock()
}

func (m *memBackend) WriteZeroes(ctx context.Context, off, n int64, fua bool) error {
	if err := m.call(ctx, "zero", off, n); err != nil {
		return err
	}
	m.zeroes.Add(1)
	if fua {
		m.fuaZeroes.Add(1)
	}
	m.clear(off, n)
	return nil
}

// snapshot returns a copy of the backend's bytes [off, off+n).
func (m *memBackend) snapshot(off, n int64) []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]byte(nil), m.data[off:off+n]...)
}

// asyncMem is a memBackend that is also an AsyncBackend and a Plugger:
// StartRead and StartWrite run the operation in a goroutine of their own
// (so completions come back in any order) unless the backend is plugged,
// when they wait for the unplug; a few complete before Start returns.
type asyncMem struct {
	*memBackend
	started, inline, plugs atomic.Int64

	mu      sync.Mutex
	plugged int
	held    []func()
}

func newAsyncMem(size int64) *asyncMem { return &asyncMem{memBackend: newMem(size)} }

func (a *asyncMem) run(f func()) {
	n := a.started.Add(1)
	a.mu.Lock()
	if a.plugged > 0 {
		a.held = append(a.held, f)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if n%7 == 0 {
		a.inline.Add(1)
		f() // done before Start returns
		return
	}
	go f()
}

func (a *asyncMem) StartRead(ctx context.Context, p []byte, off int64, c Completion) {
	a.run(func() { complete(c, a.ReadAt(ctx, p, off)) })
}

func (a *asyncMem) StartWrite(ctx context.Context, p []byte, off int64, fua bool, c Completion) {
	a.run(func() { complete(c, a.WriteAt(ctx, p, off, fua)) })
}

// complete reports err to c outside a burst: its Flusher is flushed at
// once.
func complete(c Completion, err error) {
	if f := c.Complete(err); f != nil {
		f.Flush()
	}
}

func (a *asyncMem) Plug() Unplugger {
	a.plugs.Add(1)
	a.mu.Lock()
	a.plugged++
	a.mu.Unlock()
	return unplugFunc(func() {
		a.mu.Lock()
		a.plugged--
		var run []func()
		if a.plugged == 0 {
			run, a.held = a.held, nil
		}
		a.mu.Unlock()
		for _, f := range run {
			go f()
		}
	})
}

type unplugFunc func()

func (f unplugFunc) Unplug() { f() }

// BlockStatus reports the all-zero 4 KiB blocks of m as holes (a
// BlockStatuser for base:allocation).
func (m *memBackend) BlockStatus(ctx context.Context, off, length int64, fn func(n int64, hole bool) bool) error {
	if err := m.call(ctx, "block-status", off, length); err != nil {
		return err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for end := off + length; off < end; {
		n := min(end-off, 4096-off%4096)
		hole := true
		for _, b := range m.data[off : off+n] {
			if b != 0 {
				hole = false
				break
			}
		}
		if !fn(n, hole) {
			return nil
		}
		off += n
	}
	return nil
}
