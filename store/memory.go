package store

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// NewMemory returns a Store that keeps volumes in memory, sparsely (only
// written blocks take memory). Volumes live as long as the Store; Flush and
// FUA are no-ops. It has the same semantics and errors as the thin store,
// snapshots and clones included (a snapshot here copies the volume's block
// index, so it takes time in proportion to the blocks written); raw volumes
// are ErrNotSupported.
func NewMemory() Store {
	return newVolumeStore(&memBackend{vols: make(map[string]*memVol)})
}

type memBackend struct {
	mu     sync.Mutex
	lastID uint32
	gen    atomic.Uint64 // the last write generation handed out
	vols   map[string]*memVol
}

// memVol is one volume: its record, its block array and its snapshots.
type memVol struct {
	info  VolumeInfo
	head  *memState
	snaps []*memSnap // oldest first
}

type memSnap struct {
	name    string
	created time.Time
	size    int64
	blocks  map[uint64]*memBlock
}

// memBlock is one written block. gen is the write generation of the state
// that wrote it: a state writes a block in place only if the block carries
// its own generation; a block carrying another one is shared with a
// snapshot or a clone and is copied first.
type memBlock struct {
	gen  uint64
	data [BlockSize]byte
}

// memState is a block array: a volume's head, or a snapshot opened
// read-only. A write holds mu exclusively for all its blocks, a read holds
// it shared, which makes every multi-block request atomic.
type memState struct {
	mu     sync.RWMutex
	gen    uint64
	blocks map[uint64]*memBlock
	size   atomic.Uint64 // blocks
}

// memDevice is one handle's view of a memState.
type memDevice struct{ st *memState }

func (m *memBackend) newState(blocks map[uint64]*memBlock, size int64) *memState {
	st := &memState{gen: m.gen.Add(1), blocks: blocks}
	st.size.Store(uint64(size) / BlockSize)
	return st
}

// lookup returns a volume by name; m.mu is held.
func (m *memBackend) lookup(name string) (*memVol, error) {
	mv, ok := m.vols[name]
	if !ok {
		return nil, ErrNotFound
	}
	return mv, nil
}

func (mv *memVol) snap(name string) (int, *memSnap, error) {
	for i, s := range mv.snaps {
		if s.name == name {
			return i, s, nil
		}
	}
	return 0, nil, fmt.Errorf("snapshot %q: %w", name, ErrNotFound)
}

func (m *memBackend) createVolume(_ context.Context, info VolumeInfo, opts CreateOptions) (VolumeInfo, error) {
	if opts.Raw != "" {
		return VolumeInfo{}, fmt.Errorf("raw volumes in the memory store: %w", ErrNotSupported)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.add(info, make(map[uint64]*memBlock))
}

// add stores a new volume; m.mu is held.
func (m *memBackend) add(info VolumeInfo, blocks map[uint64]*memBlock) (VolumeInfo, error) {
	if _, ok := m.vols[info.Name]; ok {
		return VolumeInfo{}, ErrExists
	}
	if m.lastID == math.MaxUint32 {
		return VolumeInfo{}, fmt.Errorf("volume ids exhausted: %w", ErrInvalid)
	}
	m.lastID++
	info.ID = m.lastID
	info.Kind = KindMemory
	m.vols[info.Name] = &memVol{info: info, head: m.newState(blocks, info.Size)}
	return info.clone(), nil
}

func (m *memBackend) getVolume(_ context.Context, name string) (VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	info := mv.info.clone()
	info.Size = int64(mv.head.size.Load()) * BlockSize
	return info, nil
}

func (m *memBackend) statVolume(_ context.Context, name string) (VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return m.stat(mv, m.refs()), nil
}

func (m *memBackend) listVolumes(context.Context) ([]VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	refs := m.refs()
	infos := make([]VolumeInfo, 0, len(m.vols))
	for _, mv := range m.vols {
		infos = append(infos, m.stat(mv, refs))
	}
	return infos, nil
}

// refs counts the references to every block from heads and snapshots;
// m.mu is held.
func (m *memBackend) refs() map[*memBlock]int {
	refs := make(map[*memBlock]int)
	for _, mv := range m.vols {
		mv.head.mu.RLock()
		for _, b := range mv.head.blocks {
			refs[b]++
		}
		mv.head.mu.RUnlock()
		for _, s := range mv.snaps {
			for _, b := range s.blocks {
				refs[b]++
			}
		}
	}
	return refs
}

// stat describes mv with its space figures; m.mu is held.
func (m *memBackend) stat(mv *memVol, refs map[*memBlock]int) VolumeInfo {
	info := mv.info.clone()
	info.Size = int64(mv.head.size.Load()) * BlockSize
	mv.head.mu.RLock()
	info.Allocated = int64(len(mv.head.blocks)) * BlockSize
	info.Exclusive = exclusiveBytes(mv.head.blocks, refs)
	mv.head.mu.RUnlock()
	info.Snapshots = make([]SnapshotInfo, 0, len(mv.snaps))
	for _, s := range mv.snaps {
		info.Snapshots = append(info.Snapshots, SnapshotInfo{Name: s.name, Created: s.created, Size: s.size,
			Exclusive: exclusiveBytes(s.blocks, refs), Clones: m.clonesOf(mv.info.Name + "@" + s.name)})
	}
	return info
}

func exclusiveBytes(blocks map[uint64]*memBlock, refs map[*memBlock]int) int64 {
	var n int64
	for _, b := range blocks {
		if refs[b] == 1 {
			n += BlockSize
		}
	}
	return n
}

// clonesOf returns the volumes cloned from origin ("VOL@SNAP"), sorted;
// m.mu is held.
func (m *memBackend) clonesOf(origin string) []string {
	var out []string
	for name, mv := range m.vols {
		if mv.info.Origin == origin {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func (m *memBackend) dependents(mv *memVol, snaps []*memSnap) error {
	for _, s := range snaps {
		if cl := m.clonesOf(mv.info.Name + "@" + s.name); len(cl) > 0 {
			return fmt.Errorf("snapshot %q has clones %v: %w", s.name, cl, ErrHasDependents)
		}
	}
	return nil
}

func (m *memBackend) deleteVolume(_ context.Context, info VolumeInfo) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil || mv.info.ID != info.ID {
		return ErrNotFound
	}
	if err := m.dependents(mv, mv.snaps); err != nil {
		return err
	}
	delete(m.vols, info.Name)
	return nil
}

func (m *memBackend) resizeVolume(_ context.Context, info VolumeInfo, size int64, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return err
	}
	st := mv.head
	st.mu.Lock()
	defer st.mu.Unlock()
	n := uint64(size) / BlockSize
	for lba := range st.blocks {
		if lba >= n {
			delete(st.blocks, lba)
		}
	}
	st.size.Store(n)
	mv.info.Size = size
	return nil
}

func (m *memBackend) createSnapshot(_ context.Context, info VolumeInfo, name string) (SnapshotInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if _, _, err := mv.snap(name); err == nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %q: %w", name, ErrExists)
	}
	st := mv.head
	st.mu.Lock()
	s := &memSnap{name: name, created: time.Now().UTC(), size: int64(st.size.Load()) * BlockSize,
		blocks: maps.Clone(st.blocks)}
	st.gen = m.gen.Add(1) // every block is now shared with s
	st.mu.Unlock()
	mv.snaps = append(mv.snaps, s)
	return SnapshotInfo{Name: s.name, Created: s.created, Size: s.size}, nil
}

func (m *memBackend) deleteSnapshot(_ context.Context, info VolumeInfo, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return err
	}
	i, s, err := mv.snap(name)
	if err != nil {
		return err
	}
	if err := m.dependents(mv, []*memSnap{s}); err != nil {
		return err
	}
	mv.snaps = slices.Delete(mv.snaps, i, i+1)
	return nil
}

func (m *memBackend) clone(_ context.Context, origin VolumeInfo, snap string, info VolumeInfo) (VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(origin.Name)
	if err != nil {
		return VolumeInfo{}, err
	}
	_, s, err := mv.snap(snap)
	if err != nil {
		return VolumeInfo{}, err
	}
	info.Size = s.size
	info.Origin = origin.Name + "@" + snap
	return m.add(info, maps.Clone(s.blocks))
}

func (m *memBackend) rollback(_ context.Context, info VolumeInfo, snap string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return err
	}
	_, s, err := mv.snap(snap)
	if err != nil {
		return err
	}
	st := mv.head
	st.mu.Lock()
	st.blocks = maps.Clone(s.blocks)
	st.gen = m.gen.Add(1)
	st.size.Store(uint64(s.size) / BlockSize)
	st.mu.Unlock()
	mv.info.Size = s.size
	return nil
}

func (m *memBackend) setMeta(_ context.Context, info VolumeInfo, meta map[string]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return err
	}
	mv.info.Meta = meta
	return nil
}

func (m *memBackend) open(_ context.Context, info VolumeInfo, snap string) (blockDevice, VolumeInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mv, err := m.lookup(info.Name)
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	if snap == "" {
		return memDevice{mv.head}, mv.info.clone(), nil
	}
	_, s, err := mv.snap(snap)
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	vi := mv.info.clone()
	vi.Name, vi.Size, vi.Created, vi.ReadOnly = info.Name+"@"+snap, s.size, s.created, true
	// Snapshot blocks are never written: the state's own generation is
	// fresh, and writes are refused above it anyway.
	return memDevice{m.newState(s.blocks, s.size)}, vi, nil
}

func (m *memBackend) sync(context.Context) error { return nil }
func (m *memBackend) close() error               { return nil }

func (d memDevice) blocks() uint64 { return d.st.size.Load() }
func (d memDevice) release() error { return nil }

// tryRead: the memory store's reads only copy memory.
func (d memDevice) tryRead(lba uint64, dst []byte) bool {
	return d.read(context.Background(), lba, dst) == nil
}

func (d memDevice) read(_ context.Context, lba uint64, dst []byte) error {
	st := d.st
	st.mu.RLock()
	defer st.mu.RUnlock()
	for i := 0; i < len(dst); i += BlockSize {
		out := dst[i : i+BlockSize]
		if b := st.blocks[lba+uint64(i/BlockSize)]; b != nil {
			copy(out, b.data[:])
		} else {
			clear(out)
		}
	}
	return nil
}

func (d memDevice) write(_ context.Context, lba uint64, src []byte, _ bool) error {
	st := d.st
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := 0; i < len(src); i += BlockSize {
		n := lba + uint64(i/BlockSize)
		if n >= st.size.Load() {
			return fmt.Errorf("block %d: volume shrank to %d blocks: %w", n, st.size.Load(), ErrOutOfRange)
		}
		b := st.blocks[n]
		if b == nil || b.gen != st.gen {
			b = &memBlock{gen: st.gen}
			st.blocks[n] = b
		}
		copy(b.data[:], src[i:i+BlockSize])
	}
	return nil
}

func (d memDevice) discard(_ context.Context, lba, count uint64, _ bool) error {
	st := d.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if count > uint64(len(st.blocks)) {
		// Cheaper to visit the written blocks than the range.
		for n := range st.blocks {
			if n >= lba && n-lba < count {
				delete(st.blocks, n)
			}
		}
		return nil
	}
	for n := lba; n-lba < count; n++ {
		delete(st.blocks, n)
	}
	return nil
}

func (d memDevice) flush(context.Context) error { return nil }

func (d memDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	st := d.st
	st.mu.RLock()
	defer st.mu.RUnlock()
	r := extentRun{fn: fn}
	for n := lba; n-lba < count; n++ {
		if (n-lba)%65536 == 65535 && ctx.Err() != nil {
			return ctx.Err()
		}
		if !r.add(n, 1, st.blocks[n] == nil) {
			return nil
		}
	}
	r.done()
	return nil
}
