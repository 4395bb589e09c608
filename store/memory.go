package store

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// NewMemory returns a Store that keeps volumes in memory, sparsely: only
// written blocks take memory, indexed by chunks of 16 blocks. Volumes
// live as long as the Store; Flush and FUA are no-ops. It has the same
// semantics and errors as the thin store, snapshots and clones included (a
// snapshot here copies the volume's chunk index, so it takes time in
// proportion to the chunks written); raw volumes are ErrNotSupported.
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
	blocks  memIndex
}

// memChunkBlocks is the number of blocks in a chunk: a large request takes
// one index lookup per 16 blocks.
const memChunkBlocks = 16

// memIndex maps a chunk number (block / memChunkBlocks) to its chunk.
type memIndex = map[uint64]*memChunk

// memChunk is one chunk with at least one written block. written has bit i
// set when block i of the chunk was written (and not discarded since); the
// other blocks read as zeros. A sparse chunk keeps each written block in a
// block of its own (blocks); a chunk with at least memDense written blocks,
// or written by a request of that many, keeps all 16 in one array (data),
// which makes large requests one copy.
//
// gen is the write generation of the state that made the chunk: a state
// changes a chunk in place only if the chunk carries its own generation; a
// chunk carrying another one is shared with a snapshot or a clone and is
// copied first. The copy shares the memory of the blocks: owned has bit i
// set when the chunk allocated blocks[i] itself, dataOwned when it
// allocated data, and only those are written in place.
type memChunk struct {
	gen       uint64
	written   uint16
	owned     uint16
	dataOwned bool
	data      *[memChunkBlocks * BlockSize]byte
	blocks    [memChunkBlocks]*[BlockSize]byte
}

// memDense is the number of written blocks from which a chunk keeps them
// in one array: at most twice the memory of its blocks.
const memDense = memChunkBlocks / 2

// block returns block i of the chunk (written).
func (c *memChunk) block(i uint64) []byte {
	if c.data != nil {
		return c.data[i*BlockSize : (i+1)*BlockSize]
	}
	return c.blocks[i][:]
}

// ownData returns a dense chunk's array for writing, copied first if
// shared.
func (c *memChunk) ownData() *[memChunkBlocks * BlockSize]byte {
	if !c.dataOwned {
		d := *c.data
		c.data, c.dataOwned = &d, true
	}
	return c.data
}

// ownBlock returns block i of a sparse chunk for writing, allocated unless
// the chunk owns it.
func (c *memChunk) ownBlock(i uint64) *[BlockSize]byte {
	if c.owned&(1<<i) == 0 {
		c.blocks[i] = new([BlockSize]byte)
		c.owned |= 1 << i
	}
	return c.blocks[i]
}

// densify moves a sparse chunk's blocks into one array.
func (c *memChunk) densify() {
	d := new([memChunkBlocks * BlockSize]byte)
	for i := range uint64(memChunkBlocks) {
		if c.written&(1<<i) != 0 {
			copy(d[i*BlockSize:], c.blocks[i][:])
		}
	}
	c.data, c.dataOwned = d, true
	c.blocks, c.owned = [memChunkBlocks]*[BlockSize]byte{}, 0
}

// chunkSpan splits the blocks [lba, lba+count) at chunk boundaries: the
// first span starts at block first of chunk ci and has n blocks.
func chunkSpan(lba, count uint64) (ci, first, n uint64) {
	ci, first = lba/memChunkBlocks, lba%memChunkBlocks
	return ci, first, min(count, memChunkBlocks-first)
}

// spanMask is the written-mask of n blocks from block first of a chunk.
func spanMask(first, n uint64) uint16 { return uint16((1<<n - 1) << first) }

// memState is a block array: a volume's head, or a snapshot opened
// read-only. A write holds mu exclusively for all its blocks, a read holds
// it shared, which makes every multi-block request atomic.
type memState struct {
	mu     sync.RWMutex
	gen    uint64
	blocks memIndex
	size   atomic.Uint64 // blocks
}

// memDevice is one handle's view of a memState.
type memDevice struct{ st *memState }

func (m *memBackend) newState(blocks memIndex, size int64) *memState {
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
	return m.add(info, make(memIndex))
}

// add stores a new volume; m.mu is held.
func (m *memBackend) add(info VolumeInfo, blocks memIndex) (VolumeInfo, error) {
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

// memRefs counts the chunks, of heads and snapshots, that hold each piece
// of block memory: a dense chunk's array or a sparse chunk's block. Copied
// chunks share the memory they have not rewritten.
type memRefs map[any]int

// add counts the memory of the chunks in blocks.
func (r memRefs) add(blocks memIndex) {
	for _, c := range blocks {
		if c.data != nil {
			r[c.data]++
			continue
		}
		for i := range uint64(memChunkBlocks) {
			if c.written&(1<<i) != 0 {
				r[c.blocks[i]]++
			}
		}
	}
}

// refs counts the references to all block memory; m.mu is held.
func (m *memBackend) refs() memRefs {
	refs := make(memRefs)
	for _, mv := range m.vols {
		mv.head.mu.RLock()
		refs.add(mv.head.blocks)
		mv.head.mu.RUnlock()
		for _, s := range mv.snaps {
			refs.add(s.blocks)
		}
	}
	return refs
}

// stat describes mv with its space figures; m.mu is held.
func (m *memBackend) stat(mv *memVol, refs memRefs) VolumeInfo {
	info := mv.info.clone()
	info.Size = int64(mv.head.size.Load()) * BlockSize
	mv.head.mu.RLock()
	info.Allocated = writtenBytes(mv.head.blocks)
	info.Exclusive = exclusiveBytes(mv.head.blocks, refs)
	mv.head.mu.RUnlock()
	info.Snapshots = make([]SnapshotInfo, 0, len(mv.snaps))
	for _, s := range mv.snaps {
		info.Snapshots = append(info.Snapshots, SnapshotInfo{Name: s.name, Created: s.created, Size: s.size,
			Exclusive: exclusiveBytes(s.blocks, refs), Clones: m.clonesOf(mv.info.Name + "@" + s.name)})
	}
	return info
}

// exclusiveBytes counts the written blocks of blocks whose memory no other
// chunk holds.
func exclusiveBytes(blocks memIndex, refs memRefs) int64 {
	var n int64
	for _, c := range blocks {
		if c.data != nil {
			if refs[c.data] == 1 {
				n += int64(bits.OnesCount16(c.written)) * BlockSize
			}
			continue
		}
		for i := range uint64(memChunkBlocks) {
			if c.written&(1<<i) != 0 && refs[c.blocks[i]] == 1 {
				n += BlockSize
			}
		}
	}
	return n
}

// writtenBytes counts the written blocks of the chunks in blocks.
func writtenBytes(blocks memIndex) int64 {
	var n int64
	for _, c := range blocks {
		n += int64(bits.OnesCount16(c.written)) * BlockSize
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
	for ci := range st.blocks {
		if ci*memChunkBlocks >= n {
			delete(st.blocks, ci)
		}
	}
	if n%memChunkBlocks != 0 {
		// The blocks past the end in the last chunk read as zeros if the
		// volume grows again.
		st.unwrite(n/memChunkBlocks, n%memChunkBlocks, memChunkBlocks-n%memChunkBlocks)
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

// tryWrite: the memory store's writes only copy memory.
func (d memDevice) tryWrite(lba uint64, src []byte) bool {
	return d.write(context.Background(), lba, src, false) == nil
}

func (d memDevice) read(_ context.Context, lba uint64, dst []byte) error {
	st := d.st
	st.mu.RLock()
	defer st.mu.RUnlock()
	for count := uint64(len(dst) / BlockSize); count > 0; {
		ci, first, n := chunkSpan(lba, count)
		out := dst[:n*BlockSize]
		c := st.blocks[ci]
		switch {
		case c == nil:
			clear(out)
		case c.data != nil && c.written&spanMask(first, n) == spanMask(first, n):
			copy(out, c.data[first*BlockSize:])
		default:
			for i := range n {
				if c.written&(1<<(first+i)) != 0 {
					copy(out[i*BlockSize:], c.block(first+i))
				} else {
					clear(out[i*BlockSize : (i+1)*BlockSize])
				}
			}
		}
		dst, lba, count = dst[len(out):], lba+n, count-n
	}
	return nil
}

func (d memDevice) write(_ context.Context, lba uint64, src []byte, _ bool) error {
	st := d.st
	st.mu.Lock()
	defer st.mu.Unlock()
	count := uint64(len(src) / BlockSize)
	if size := st.size.Load(); lba+count > size {
		return fmt.Errorf("block %d: volume shrank to %d blocks: %w", max(lba, size), size, ErrOutOfRange)
	}
	for count > 0 {
		ci, first, n := chunkSpan(lba, count)
		c := st.own(ci)
		if c.data == nil && (n >= memDense || bits.OnesCount16(c.written|spanMask(first, n)) >= memDense) {
			c.densify()
		}
		if c.data != nil {
			copy(c.ownData()[first*BlockSize:], src[:n*BlockSize])
		} else {
			for i := range n {
				copy(c.ownBlock(first + i)[:], src[i*BlockSize:])
			}
		}
		c.written |= spanMask(first, n)
		src, lba, count = src[n*BlockSize:], lba+n, count-n
	}
	return nil
}

// own returns chunk ci for writing: the state's own, made or copied from a
// shared one as needed; st.mu is held exclusively.
func (st *memState) own(ci uint64) *memChunk {
	c := st.blocks[ci]
	if c != nil && c.gen == st.gen {
		return c
	}
	nc := &memChunk{gen: st.gen}
	if c != nil {
		// The memory stays shared until written (owned, dataOwned).
		nc.written, nc.data, nc.blocks = c.written, c.data, c.blocks
	}
	st.blocks[ci] = nc
	return nc
}

// unwrite makes n blocks from block first of chunk ci read as zeros;
// st.mu is held exclusively.
func (st *memState) unwrite(ci, first, n uint64) {
	c := st.blocks[ci]
	if c == nil || c.written&spanMask(first, n) == 0 {
		return
	}
	if c.written&^spanMask(first, n) == 0 {
		delete(st.blocks, ci)
		return
	}
	c = st.own(ci)
	c.written &^= spanMask(first, n)
	if c.data == nil {
		for i := first; i < first+n; i++ {
			c.blocks[i] = nil
			c.owned &^= 1 << i
		}
	}
}

func (d memDevice) discard(_ context.Context, lba, count uint64, _ bool) error {
	st := d.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if count/memChunkBlocks > uint64(len(st.blocks)) {
		// Cheaper to visit the written chunks than the range.
		for ci := range st.blocks {
			lo, hi := max(lba, ci*memChunkBlocks), min(lba+count, (ci+1)*memChunkBlocks)
			if lo < hi {
				st.unwrite(ci, lo%memChunkBlocks, hi-lo)
			}
		}
		return nil
	}
	for count > 0 {
		ci, first, n := chunkSpan(lba, count)
		st.unwrite(ci, first, n)
		lba, count = lba+n, count-n
	}
	return nil
}

func (d memDevice) flush(context.Context) error { return nil }

func (d memDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	st := d.st
	st.mu.RLock()
	defer st.mu.RUnlock()
	r := extentRun{fn: fn}
	for visited := uint64(0); count > 0; {
		if visited >= 65536 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			visited = 0
		}
		ci, first, n := chunkSpan(lba, count)
		var written uint16
		if c := st.blocks[ci]; c != nil {
			written = c.written
		}
		for i := range n {
			if !r.add(lba+i, 1, written&(1<<(first+i)) == 0) {
				return nil
			}
		}
		lba, count, visited = lba+n, count-n, visited+n
	}
	r.done()
	return nil
}
