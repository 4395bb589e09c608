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

// A clusterMap is a two-level radix tree: directories of mapDirLen pages
// of mapPageLen entries, both made on first use, under a slice of
// directories grown to the highest one used. Its memory follows the
// clusters mapped: an empty volume of any size costs nothing, and each
// directory used costs 8 bytes in the slice, 4 KiB for the directory and
// 4 KiB per page (with 64 KiB clusters a page maps 32 MiB of a volume and
// a directory 16 GiB).
const (
	mapPageLen = 512
	mapDirLen  = 512
	mapDirSpan = mapPageLen * mapDirLen // clusters under one directory
)

type mapPage [mapPageLen]atomic.Uint64

type mapDir [mapDirLen]atomic.Pointer[mapPage]

// clusterMap is the in-memory map of a volume, logical cluster to entry.
// Readers load entries atomically without a lock; writers of one cluster
// are serialized by the caller (the cluster locks), and growMu serializes
// the making of directories and pages.
type clusterMap struct {
	growMu sync.Mutex
	dirs   atomic.Pointer[[]atomic.Pointer[mapDir]]
}

func newClusterMap() *clusterMap {
	m := &clusterMap{}
	m.dirs.Store(new([]atomic.Pointer[mapDir]))
	return m
}

// page returns the page of cluster c, nil when it was never made.
func (m *clusterMap) page(c uint64) *mapPage {
	dirs := *m.dirs.Load()
	i := c / mapDirSpan
	if i >= uint64(len(dirs)) {
		return nil
	}
	d := dirs[i].Load()
	if d == nil {
		return nil
	}
	return d[c/mapPageLen%mapDirLen].Load()
}

func (m *clusterMap) get(c uint64) entry {
	if p := m.page(c); p != nil {
		return entry(p[c%mapPageLen].Load())
	}
	return 0
}

func (m *clusterMap) set(c uint64, e entry) {
	p := m.page(c)
	if p == nil {
		if e == 0 {
			return
		}
		p = m.makePage(c)
	}
	p[c%mapPageLen].Store(uint64(e))
}

// makePage returns the page of cluster c, making it (and its directory,
// and room for that in the slice) if need be.
func (m *clusterMap) makePage(c uint64) *mapPage {
	m.growMu.Lock()
	defer m.growMu.Unlock()
	dirs := *m.dirs.Load()
	i := c / mapDirSpan
	if i >= uint64(len(dirs)) {
		// Doubling keeps a volume written from start to end from
		// copying the slice at every directory.
		grown := make([]atomic.Pointer[mapDir], max(i+1, 2*uint64(len(dirs))))
		for j := range dirs {
			grown[j].Store(dirs[j].Load())
		}
		m.dirs.Store(&grown)
		dirs = grown
	}
	d := dirs[i].Load()
	if d == nil {
		d = new(mapDir)
		dirs[i].Store(d)
	}
	j := c / mapPageLen % mapDirLen
	p := d[j].Load()
	if p == nil {
		p = new(mapPage)
		d[j].Store(p)
	}
	return p
}

// each calls fn for every non-zero entry in cluster order.
func (m *clusterMap) each(fn func(c uint64, e entry)) {
	dirs := *m.dirs.Load()
	for i := range dirs {
		d := dirs[i].Load()
		if d == nil {
			continue
		}
		for j := range d {
			p := d[j].Load()
			if p == nil {
				continue
			}
			base := uint64(i)*mapDirSpan + uint64(j)*mapPageLen
			for k := range p {
				if e := entry(p[k].Load()); e != 0 {
					fn(base+uint64(k), e)
				}
			}
		}
	}
}

// nextMapped returns the first cluster at or after c whose page exists (a
// skip over unmapped space for scans), or end.
func (m *clusterMap) nextMapped(c, end uint64) uint64 {
	dirs := *m.dirs.Load()
	for c < end {
		i := c / mapDirSpan
		if i >= uint64(len(dirs)) {
			return end
		}
		d := dirs[i].Load()
		if d == nil {
			c = (i + 1) * mapDirSpan
			continue
		}
		if d[c/mapPageLen%mapDirLen].Load() != nil {
			return c
		}
		c = (c/mapPageLen + 1) * mapPageLen
	}
	return end
}
