package store_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/loopfs"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

// TestThinFullFileSystem fills the file system under a thin store through
// a volume larger than it. Writes past the reserve fail with ErrNoSpace;
// the store itself goes on: it commits, overwrites what it holds, takes
// snapshots and creates volumes, takes new writes again once a trim gave
// space back, and holds every acknowledged write after a reopen. Without
// the reserve, badger's next write to its memory-mapped log found no free
// block and the process died of SIGBUS.
func TestThinFullFileSystem(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(loopfs.Ext4(t, 160<<20), "store")
	opts := store.ThinOptions{Reserve: 32 << 20}
	s, err := store.OpenThin(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	if _, err := s.CreateVolume(ctx, "v", 1<<30, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	const per = mib / store.BlockSize
	written := uint64(0) // whole MiBs acknowledged
	for ; ; written++ {
		err := v.WriteBlocks(ctx, written*per, storetest.Pattern(written*per, per, 1), false)
		if err == nil {
			continue
		}
		if !errors.Is(err, store.ErrNoSpace) {
			t.Fatalf("write of MiB %d: %v, want ErrNoSpace", written, err)
		}
		break
	}
	// 160 MiB less ext4's own, badger's and the 32 MiB reserve.
	if written < 48 {
		t.Fatalf("only %d MiB written before ErrNoSpace", written)
	}
	t.Logf("%d MiB written before ErrNoSpace", written)
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush on a full file system: %v", err)
	}
	// An overwrite of data the volume holds takes no space: it goes through.
	if err := v.WriteBlocks(ctx, 0, storetest.Pattern(0, per, 2), true); err != nil {
		t.Fatalf("overwrite on a full file system: %v", err)
	}
	// Blocks in new clusters, past the MiB refused, take what is left
	// above the reserve (less than a MiB), then are refused.
	lba := (written + 1) * per
	for i := 0; ; i++ {
		err := v.WriteBlocks(ctx, lba, storetest.Pattern(lba, 1, 3), false)
		if errors.Is(err, store.ErrNoSpace) {
			break
		}
		if err != nil || i == 1000 {
			t.Fatalf("4 KiB write %d to a new cluster on a full file system: %v, want ErrNoSpace by now", i, err)
		}
		lba += 16 // the next 64 KiB cluster
	}
	// A trim gives space back; within a few of the store's one-second
	// checks of the free space, new clusters are taken again.
	half := written / 2
	if err := v.Trim(ctx, half*per, (written-half)*per); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := v.WriteBlocks(ctx, half*per, storetest.Pattern(half*per, per, 4), false)
		if err == nil {
			break
		}
		if !errors.Is(err, store.ErrNoSpace) || time.Now().After(deadline) {
			t.Fatalf("write after a trim gave space back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := s.CreateSnapshot(ctx, "v", "s"); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if _, err := s.CreateVolume(ctx, "w", 1<<30, store.CreateOptions{}); err != nil {
		t.Fatalf("create a volume: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	storeCheck := func(s store.Store) {
		t.Helper()
		v, err := s.OpenVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		got := make([]byte, mib)
		for m := uint64(0); m < written; m++ {
			var want []byte
			switch {
			case m == 0:
				want = storetest.Pattern(0, per, 2)
			case m < half:
				want = storetest.Pattern(m*per, per, 1)
			case m == half:
				want = storetest.Pattern(m*per, per, 4)
			default:
				want = make([]byte, mib) // trimmed
			}
			if err := v.ReadBlocks(ctx, m*per, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("MiB %d differs from what was written", m)
			}
		}
	}
	storeCheck(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = nil
	s2, err := store.OpenThin(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	storeCheck(s2)
	store.CheckThin(t, s2)
}
