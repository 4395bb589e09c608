package store

import (
	"context"
	"testing"
)

// TestInMemory: a memory store's volumes say they only copy memory (the
// front ends then run their requests in the completion loop); a thin
// store's do not.
func TestInMemory(t *testing.T) {
	ctx := context.Background()
	b, err := OpenThin(t.TempDir(), ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		name string
		st   Store
		want bool
	}{{"memory", NewMemory(), true}, {"thin", b, false}} {
		if _, err := c.st.CreateVolume(ctx, "v", 1<<20, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		v, err := c.st.OpenVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		if got := v.InMemory(); got != c.want {
			t.Errorf("%s: InMemory() = %v", c.name, got)
		}
		v.Close()
	}
}

// TestMemoryExclusive: after a snapshot, a chunk copied for a write shares
// the memory it did not rewrite, and Exclusive counts only the memory one
// side holds alone: a dense chunk's array is copied whole on its first
// write (16 blocks each side), a sparse chunk's untouched blocks stay
// shared (1 block each side for 1 rewritten).
func TestMemoryExclusive(t *testing.T) {
	ctx := context.Background()
	st := NewMemory()
	if _, err := st.CreateVolume(ctx, "v", 1<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	write := func(lba uint64, blocks int) {
		t.Helper()
		if err := v.WriteBlocks(ctx, lba, make([]byte, blocks*BlockSize), false); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 16) // chunk 0, dense
	write(16, 1) // chunk 1, sparse: blocks 16 and 17
	write(17, 1)
	if _, err := st.CreateSnapshot(ctx, "v", "s"); err != nil {
		t.Fatal(err)
	}
	info, err := st.StatVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if info.Allocated != 18*BlockSize || info.Exclusive != 0 || info.Snapshots[0].Exclusive != 0 {
		t.Fatalf("after the snapshot: allocated %d, exclusive %d, snapshot's %d", info.Allocated, info.Exclusive, info.Snapshots[0].Exclusive)
	}
	write(0, 1)
	write(16, 1)
	if info, err = st.StatVolume(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if want := int64(17 * BlockSize); info.Exclusive != want || info.Snapshots[0].Exclusive != want {
		t.Fatalf("after rewriting a block of each chunk: exclusive %d, snapshot's %d, want %d each",
			info.Exclusive, info.Snapshots[0].Exclusive, want)
	}
}
