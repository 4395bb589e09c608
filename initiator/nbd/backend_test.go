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
	m.mu.Lock()
	clear(m.data[off : off+n])
	m.mu.Unlock()
	return nil
}

func (m *memBackend) WriteZeroes(ctx context.Context, off, n int64, fua bool) error {
	if err := m.call(ctx, "zero", off, n); err != nil {
		return err
	}
	m.zeroes.Add(1)
	if fua {
		m.fuaZeroes.Add(1)
	}
	m.mu.Lock()
	clear(m.data[off : off+n])
	m.mu.Unlock()
	return nil
}

// snapshot returns a copy of the backend's bytes [off, off+n).
func (m *memBackend) snapshot(off, n int64) []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]byte(nil), m.data[off:off+n]...)
}
