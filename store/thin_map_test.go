package store

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestClusterMapModel checks get, set, each and nextMapped against a Go
// map, with clusters spread from 0 to the largest a volume may have, so
// that pages, directories and the growth of the directory slice are all
// crossed.
func TestClusterMapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := newClusterMap()
	model := map[uint64]entry{}
	pick := func() uint64 {
		switch rng.IntN(4) {
		case 0: // the first directory
			return rng.Uint64N(mapDirSpan)
		case 1: // around a page or directory boundary
			b := []uint64{mapPageLen, mapDirSpan, 7 * mapDirSpan, 1 << 30}[rng.IntN(4)]
			return b - 2 + rng.Uint64N(4)
		case 2: // the last clusters a volume may have
			return maxThinClusters - 1 - rng.Uint64N(3*mapPageLen)
		}
		return rng.Uint64N(1 << 34)
	}
	for i := range 20000 {
		c := pick()
		if rng.IntN(4) == 0 {
			m.set(c, 0)
			delete(model, c)
		} else {
			e := mkEntry(uint64(i+1), uint32(i))
			m.set(c, e)
			model[c] = e
		}
		if q := pick(); m.get(q) != model[q] {
			t.Fatalf("step %d: get(%d) = %#x, want %#x", i, q, m.get(q), model[q])
		}
	}
	for c, e := range model {
		if m.get(c) != e {
			t.Fatalf("get(%d) = %#x, want %#x", c, m.get(c), e)
		}
	}
	var want []uint64
	for c := range model {
		want = append(want, c)
	}
	slices.Sort(want)
	var got []uint64
	m.each(func(c uint64, e entry) {
		if e != model[c] {
			t.Fatalf("each: cluster %d = %#x, want %#x", c, e, model[c])
		}
		got = append(got, c)
	})
	if !slices.Equal(got, want) {
		t.Fatalf("each visited %d clusters, want %d", len(got), len(want))
	}
	// nextMapped never skips a mapped cluster and stops at end.
	for i := range 2000 {
		c, end := pick(), pick()
		if c > end {
			c, end = end, c
		}
		next := m.nextMapped(c, end)
		if next < c || next > end {
			t.Fatalf("step %d: nextMapped(%d, %d) = %d, outside the range", i, c, end, next)
		}
		if k, _ := slices.BinarySearch(want, c); k < len(want) && want[k] < next {
			t.Fatalf("step %d: nextMapped(%d, %d) = %d skips mapped cluster %d", i, c, end, next, want[k])
		}
		if next < end && m.page(next) == nil {
			t.Fatalf("step %d: nextMapped(%d, %d) = %d, a cluster without a page", i, c, end, next)
		}
	}
}

// TestClusterMapMemory: a map costs nothing until written, and a write at
// the end of the largest volume costs the directory slice, not memory in
// proportion to the volume's size.
func TestClusterMapMemory(t *testing.T) {
	m := newClusterMap()
	if n := len(*m.dirs.Load()); n != 0 {
		t.Fatalf("new map has %d directories", n)
	}
	m.set(maxThinClusters-1, mkEntry(5, 1))
	if n, max := len(*m.dirs.Load()), maxThinClusters/mapDirSpan; n != max {
		t.Fatalf("a write to the last cluster made %d directory slots, want %d", n, max)
	}
	if m.get(maxThinClusters-1).phys() != 5 || m.get(maxThinClusters-2) != 0 || m.get(0) != 0 {
		t.Fatal("wrong entries around the last cluster")
	}
}

// TestClusterMapConcurrent runs writers, each owning its clusters (as the
// cluster locks make them), against readers, while the directory slice
// grows; run with -race.
func TestClusterMapConcurrent(t *testing.T) {
	m := newClusterMap()
	const writers, per = 4, 3000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				// Writer w owns clusters = w mod writers, spread over
				// ever higher directories.
				c := uint64(i)*mapDirSpan/8*writers + uint64(w)
				m.set(c, mkEntry(c+1, 1))
				if got := m.get(c); got.phys() != c+1 {
					t.Errorf("writer %d: get(%d) after set = %#x", w, c, got)
					return
				}
			}
		}()
	}
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := rng.Uint64N(per * mapDirSpan / 8 * writers)
				if e := m.get(c); e != 0 && e.phys() != c+1 {
					t.Errorf("reader: get(%d) = %#x", c, e)
					return
				}
				m.nextMapped(c, c+mapDirSpan)
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	n := 0
	m.each(func(c uint64, e entry) {
		if e.phys() != c+1 {
			t.Errorf("each: cluster %d = %#x", c, e)
		}
		n++
	})
	if n != writers*per {
		t.Fatalf("each found %d entries, want %d", n, writers*per)
	}
}
