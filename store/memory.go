package store

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// NewMemory returns a Store that keeps volumes in memory, sparsely (only
// written blocks take memory). Volumes live as long as the Store; Flush and
// FUA are no-ops. It has the same semantics and errors as the badger store.
func NewMemory() Store {
	return newVolumeStore(&memBackend{vols: make(map[string]*memVolume)})
}

type memBackend struct {
	mu     sync.Mutex
	lastID uint32
	vols   map[string]*memVolume
}

// memVolume is one volume: a sparse map of written blocks. A write holds mu
// exclusively for all its blocks, a read holds it shared, which makes every
// multi-block request atomic.
type memVolume struct {
	info   VolumeInfo
	mu     sync.RWMutex
	blocks map[uint64]*[BlockSize]byte
}

func (m *memBackend) createVolume(_ context.Context, info VolumeInfo) (VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.vols[info.Name]; ok {
		return VolumeInfo{}, ErrExists
	}
	if m.lastID == math.MaxUint32 {
		return VolumeInfo{}, fmt.Errorf("volume ids exhausted: %w", ErrInvalid)
	}
	m.lastID++
	info.ID = m.lastID
	m.vols[info.Name] = &memVolume{info: info, blocks: make(map[uint64]*[BlockSize]byte)}
	return info, nil
}

func (m *memBackend) getVolume(_ context.Context, name string) (VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, ok := m.vols[name]
	if !ok {
		return VolumeInfo{}, ErrNotFound
	}
	return mv.info.clone(), nil
}

func (m *memBackend) listVolumes(context.Context) ([]VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	infos := make([]VolumeInfo, 0, len(m.vols))
	for _, mv := range m.vols {
		infos = append(infos, mv.info.clone())
	}
	return infos, nil
}

func (m *memBackend) deleteVolume(_ context.Context, info VolumeInfo) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mv, ok := m.vols[info.Name]; !ok || mv.info.ID != info.ID {
		return ErrNotFound
	}
	delete(m.vols, info.Name)
	return nil
}

func (m *memBackend) device(info VolumeInfo) blockDevice {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vols[info.Name]
}

func (m *memBackend) sync(context.Context) error { return nil }
func (m *memBackend) close() error               { return nil }

func (mv *memVolume) read(_ context.Context, lba uint64, dst []byte) error {
	mv.mu.RLock()
	defer mv.mu.RUnlock()
	for i := 0; i < len(dst); i += BlockSize {
		out := dst[i : i+BlockSize]
		if b := mv.blocks[lba+uint64(i/BlockSize)]; b != nil {
			copy(out, b[:])
		} else {
			clear(out)
		}
	}
	return nil
}

func (mv *memVolume) write(_ context.Context, lba uint64, src []byte, _ bool) error {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	for i := 0; i < len(src); i += BlockSize {
		n := lba + uint64(i/BlockSize)
		b := mv.blocks[n]
		if b == nil {
			b = new([BlockSize]byte)
			mv.blocks[n] = b
		}
		copy(b[:], src[i:i+BlockSize])
	}
	return nil
}

func (mv *memVolume) discard(_ context.Context, lba, count uint64, _ bool) error {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if count > uint64(len(mv.blocks)) {
		// Cheaper to visit the written blocks than the range.
		for n := range mv.blocks {
			if n >= lba && n-lba < count {
				delete(mv.blocks, n)
			}
		}
		return nil
	}
	for n := lba; n-lba < count; n++ {
		delete(mv.blocks, n)
	}
	return nil
}

func (mv *memVolume) flush(context.Context) error { return nil }
