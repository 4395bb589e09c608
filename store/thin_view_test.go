package store_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// TestThinSnapshotViewWindow reads every snapshot and clone of a chain
// with the two ways a snapshot's view is resolved: a cluster at a time
// (below viewSeekFrom snapshots) and a window of clusters at a time (from
// there on). Both must read what the volume held when each snapshot was
// taken, and report the same extents. The chain has more snapshots than
// the bound, one deleted in the middle, a resize between snapshots, trims
// and zeroed ranges, a clone of an older snapshot grown past its origin,
// and a clone of that clone's snapshot; the volume's size ends inside a
// window and inside a cluster.
func TestThinSnapshotViewWindow(t *testing.T) {
	ctx := context.Background()
	const bs = store.BlockSize
	const cb = 4 // blocks per cluster
	s, err := store.OpenThin(t.TempDir(), store.ThinOptions{ClusterSize: cb * bs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	blocks := uint64(150*cb + 1)
	if _, err := s.CreateVolume(ctx, "a", int64(blocks*bs), store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	open := func(name string) store.Volume {
		t.Helper()
		v, err := s.OpenVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	readAll := func(v store.Volume) []byte {
		t.Helper()
		data := make([]byte, v.Info().Size)
		if err := v.ReadBlocks(ctx, 0, data); err != nil {
			t.Fatal(err)
		}
		return data
	}
	// churn writes, trims and zeroes random ranges of v.
	churn := func(v store.Volume, n int) {
		t.Helper()
		size := uint64(v.Info().Size) / bs
		for range n {
			lba := rng.Uint64N(size)
			count := min(size-lba, 1+rng.Uint64N(3*cb))
			var err error
			switch rng.IntN(5) {
			case 0:
				err = v.Trim(ctx, lba, count)
			case 1:
				err = v.WriteZeroes(ctx, lba, count, false)
			default:
				buf := make([]byte, count*bs)
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
				err = v.WriteBlocks(ctx, lba, buf, false)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := v.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][]byte{}
	snapshot := func(v store.Volume, vol, snap string) {
		t.Helper()
		want[vol+"@"+snap] = readAll(v)
		if _, err := s.CreateSnapshot(ctx, vol, snap); err != nil {
			t.Fatal(err)
		}
	}

	a := open("a")
	churn(a, 400)
	for i := range 12 {
		snapshot(a, "a", fmt.Sprintf("s%d", i))
		churn(a, 40)
		if i == 6 {
			blocks += 70 * cb
			if err := s.ResizeVolume(ctx, "a", int64(blocks*bs)); err != nil {
				t.Fatal(err)
			}
			a.Close()
			a = open("a")
			churn(a, 40)
		}
	}
	want["a"] = readAll(a)
	if err := s.DeleteSnapshot(ctx, "a", "s5"); err != nil {
		t.Fatal(err)
	}
	delete(want, "a@s5")
	a.Close()

	if _, err := s.Clone(ctx, "a", "s3", "c", store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.ResizeVolume(ctx, "c", int64((blocks+9*cb)*bs)); err != nil {
		t.Fatal(err)
	}
	c := open("c")
	churn(c, 30)
	for i := range 9 {
		snapshot(c, "c", fmt.Sprintf("s%d", i))
		churn(c, 20)
	}
	want["c"] = readAll(c)
	c.Close()
	if _, err := s.Clone(ctx, "c", "s1", "d", store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := open("d")
	churn(d, 20)
	want["d"] = readAll(d)
	d.Close()

	type view struct {
		data    []byte
		extents []store.Extent
	}
	read := func(name string, from int) view {
		t.Helper()
		store.SetViewWindowFrom(s, from)
		v := open(name)
		defer v.Close()
		var out view
		// Reads of a block at a time first, from the end, so that windows
		// are resolved from their last clusters, then the whole.
		n := uint64(v.Info().Size) / bs
		blk := make([]byte, bs)
		for lba := n; lba > 0; lba -= min(lba, 37) {
			if err := v.ReadBlocks(ctx, lba-1, blk); err != nil {
				t.Fatal(err)
			}
		}
		out.data = readAll(v)
		if err := v.BlockStatus(ctx, 0, n, func(e store.Extent) bool {
			out.extents = append(out.extents, e)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	}) {
		one, window := read(name, 1<<30), read(name, 1)
		if !bytes.Equal(one.data, want[name]) {
			t.Errorf("%s: a cluster at a time reads other data than the volume held", name)
		}
		if !bytes.Equal(window.data, want[name]) {
			t.Errorf("%s: a window at a time reads other data than the volume held", name)
		}
		if !slices.Equal(one.extents, window.extents) {
			t.Errorf("%s: extents differ: a cluster at a time %v, a window at a time %v", name, one.extents, window.extents)
		}
	}
	store.CheckThin(t, s)
}
