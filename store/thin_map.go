package store

import (
	"sync"
	"sync/atomic"
)

// entry is one logical cluster's mapping, in a head map or a snapshot delta
// (the same 8 bytes in memory and in the database):
//
//	bits  0-39  physical cluster (0: none)
//	bits 40-61  birth: the volume epoch the entry was made in
//	bit  62     hole: reads as zeros, never falls through to a clone's origin
//	bit  63     counted: the physical cluster may have other references
//	            (a rollback took it from a snapshot): always copied on write
//
// The zero entry is "absent": zeros, or for a clone its origin's data. An
// entry without a cluster or the hole bit but with a birth is absent too; it
// only remembers when the cluster became absent (see doc.go, Snapshots).
type entry uint64

const (
	entryPhysBits  = 40
	entryBirthBits = 22
	entryPhysMask  = 1<<entryPhysBits - 1
	entryBirthMask = 1<<entryBirthBits - 1
	entryHole      = entry(1) << 62
	entryCounted   = entry(1) << 63

	// maxEpoch bounds a volume's epochs: a volume takes at most this many
	// snapshots in its life.
	maxEpoch = entryBirthMask
)

func mkEntry(p uint64, birth uint32) entry {
	return entry(p&entryPhysMask) | entry(birth&entryBirthMask)<<entryPhysBits
}

func holeEntry(birth uint32) entry { return mkEntry(0, birth) | entryHole }

func (e entry) phys() uint64  { return uint64(e) & entryPhysMask }
func (e entry) birth() uint32 { return uint32(uint64(e)>>entryPhysBits) & entryBirthMask }
func (e entry) hole() bool    { return e&entryHole != 0 }
func (e entry) counted() bool { return e&entryCounted != 0 }
func (e entry) absent() bool  { return e.phys() == 0 && !e.hole() }
func (e entry) withBirth(b uint32) entry {
	return e&^(entryBirthMask<<entryPhysBits) | entry(b&entryBirthMask)<<entryPhysBits
}

// mapPageLen is the number of entries of one page of a clusterMap.
const mapPageLen = 512

type mapPage [mapPageLen]atomic.Uint64

// clusterMap is the in-memory map of a volume, logical cluster to entry:
// pages of mapPageLen entries made on first use, so memory follows the
// clusters mapped, not the volume's size. Readers load entries
// atomically without a lock; writers of one cluster are serialized by the
// caller (the cluster locks).
type clusterMap struct {
	growMu sync.Mutex
	pages  atomic.Pointer[[]atomic.Pointer[mapPage]]
}

func newClusterMap(clusters uint64) *clusterMap {
	m := &clusterMap{}
	pages := make([]atomic.Pointer[mapPage], (clusters+mapPageLen-1)/mapPageLen)
	m.pages.Store(&pages)
	return m
}

func (m *clusterMap) get(c uint64) entry {
	pages := *m.pages.Load()
	if i := c / mapPageLen; i < uint64(len(pages)) {
		if p := pages[i].Load(); p != nil {
			return entry(p[c%mapPageLen].Load())
		}
	}
	return 0
}

func (m *clusterMap) set(c uint64, e entry) {
	pages := *m.pages.Load()
	i := c / mapPageLen
	if i >= uint64(len(pages)) {
		m.grow(c + 1)
		pages = *m.pages.Load()
	}
	p := pages[i].Load()
	if p == nil {
		if e == 0 {
			return
		}
		m.growMu.Lock()
		if p = pages[i].Load(); p == nil {
			p = new(mapPage)
			pages[i].Store(p)
		}
		m.growMu.Unlock()
	}
	p[c%mapPageLen].Store(uint64(e))
}

// grow makes room for clusters clusters (a volume grown while open).
func (m *clusterMap) grow(clusters uint64) {
	m.growMu.Lock()
	defer m.growMu.Unlock()
	old := *m.pages.Load()
	n := (clusters + mapPageLen - 1) / mapPageLen
	if n <= uint64(len(old)) {
		return
	}
	pages := make([]atomic.Pointer[mapPage], n)
	for i := range old {
		pages[i].Store(old[i].Load())
	}
	m.pages.Store(&pages)
}

// each calls fn for every non-zero entry in cluster order.
func (m *clusterMap) each(fn func(c uint64, e entry)) {
	pages := *m.pages.Load()
	for i := range pages {
		p := pages[i].Load()
		if p == nil {
			continue
		}
		for j := range p {
			if e := entry(p[j].Load()); e != 0 {
				fn(uint64(i)*mapPageLen+uint64(j), e)
			}
		}
	}
}

// nextMapped returns the first cluster at or after c whose page exists (a
// skip over unmapped space for scans), or end.
func (m *clusterMap) nextMapped(c, end uint64) uint64 {
	pages := *m.pages.Load()
	for c < end {
		i := c / mapPageLen
		if i >= uint64(len(pages)) {
			return end
		}
		if pages[i].Load() != nil {
			return c
		}
		c = (i + 1) * mapPageLen
	}
	return end
}
