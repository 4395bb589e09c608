package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	l := openLoopThin(t)
	s := l.s
	v := createOpen(t, s, "v", 1<<30)
	const mib = 1 << 20
	const per = mib / store.BlockSize
	written := fillMiBs(t, v, 0, 1) // whole MiBs acknowledged
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
	fillClusters(t, v, (written+1)*per)
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
	s2 := l.reopen(t)
	storeCheck(s2)
	store.CheckThin(t, s2)
}

// TestThinBallast fills the file system under a thin store from outside
// it, as another program would: the store's reserve is then gone, but its
// ballast is not. The first metadata transaction after that gives the
// ballast's blocks to badger, so that snapshots, volume creates, trims and
// commits go on (the log they append to takes new blocks through a memory
// map: without free blocks the process dies of SIGBUS), while writes into
// new clusters fail with ErrNoSpace. Once the other program's file is
// gone, the ballast comes back; everything acknowledged reads back after a
// reopen.
func TestThinBallast(t *testing.T) {
	ctx := context.Background()
	l := openLoopThin(t)
	s, mnt, dir := l.s, l.mnt, l.dir
	ballast := filepath.Join(dir, "data", "ballast")
	held := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(ballast, &st); err != nil {
			return 0
		}
		return st.Blocks * 512
	}
	ballastBefore := held()
	if ballastBefore < 16<<20 { // half the reserve
		t.Fatalf("ballast holds %d bytes, want %d", ballastBefore, 16<<20)
	}
	v := createOpen(t, s, "v", 1<<30)
	const mib = 1 << 20
	const per = mib / store.BlockSize
	for m := uint64(0); m < 8; m++ {
		if err := v.WriteBlocks(ctx, m*per, storetest.Pattern(m*per, per, 1), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// Another program takes every free block.
	other := filepath.Join(mnt, "other")
	f, err := os.Create(other)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mib)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if held() == 0 {
		// The store's once-a-second check saw the file system fill
		// and let the ballast go before the loop ended, and the loop
		// took its blocks too (one -race run in three, under load).
		// The state this test is about is that of a program that
		// stopped just short of that: it gives them back.
		st, err := os.Stat(other)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(other, max(st.Size()-ballastBefore, 0)); err != nil {
			t.Fatal(err)
		}
		t.Logf("the ballast went while the file system filled: gave %d bytes back", ballastBefore)
	}

	// Metadata keeps working: snapshots, trims and commits.
	for i := range 150 {
		if _, err := s.CreateSnapshot(ctx, "v", fmt.Sprintf("snapshot-%03d-%s", i, strings.Repeat("x", 100))); err != nil {
			t.Fatalf("snapshot %d on a file system filled by another program: %v", i, err)
		}
		if i == 0 && held() != 0 {
			t.Fatal("the ballast is still there after the first transaction on a full file system")
		}
		if err := v.Trim(ctx, uint64(i%8)*per, 16); err != nil {
			t.Fatalf("trim %d: %v", i, err)
		}
		if err := v.Flush(ctx); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	if _, err := s.CreateVolume(ctx, "w", 1<<30, store.CreateOptions{}); err != nil {
		t.Fatalf("create a volume: %v", err)
	}
	if err := v.WriteBlocks(ctx, 100*per, storetest.Pattern(100*per, per, 2), false); !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("write into new clusters on a full file system: %v, want ErrNoSpace", err)
	}
	// Past the ballast, metadata that adds to the database is refused
	// before badger runs out of blocks; what gives space back goes on.
	// Volume attributes of 60 KiB, each a new value, fill the database
	// faster than snapshots (a key of a few hundred bytes each).
	snaps := 150
	for ; ; snaps++ {
		pad := fmt.Sprintf("%06d", snaps) + strings.Repeat("y", 60<<10)
		err := s.SetMeta(ctx, "v", map[string]string{"pad": pad})
		if err == nil {
			_, err = s.CreateSnapshot(ctx, "v", fmt.Sprintf("snapshot-%03d-%s", snaps, strings.Repeat("x", 100)))
		} else if errors.Is(err, store.ErrNoSpace) {
			_, err = s.CreateSnapshot(ctx, "v", fmt.Sprintf("snapshot-%03d-%s", snaps, strings.Repeat("x", 100)))
			if !errors.Is(err, store.ErrNoSpace) {
				t.Fatalf("snapshot after attributes were refused for space: %v, want ErrNoSpace", err)
			}
		}
		if errors.Is(err, store.ErrNoSpace) {
			break
		}
		if err != nil || snaps == 3000 {
			t.Fatalf("snapshot %d on a full file system: %v, want ErrNoSpace by now", snaps, err)
		}
	}
	t.Logf("%d snapshots, then ErrNoSpace", snaps)
	if _, err := s.CreateVolume(ctx, "x", 1<<30, store.CreateOptions{}); !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("create a volume below the floor: %v, want ErrNoSpace", err)
	}
	if err := s.DeleteSnapshot(ctx, "v", fmt.Sprintf("snapshot-%03d-%s", 0, strings.Repeat("x", 100))); err != nil {
		t.Fatalf("delete a snapshot below the floor: %v", err)
	}
	snaps--
	if err := v.Trim(ctx, 7*per, 16); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush below the floor: %v", err)
	}

	// The other program's file goes: within a few of the store's
	// one-second checks the ballast is back.
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for held() < 16<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("ballast holds %d bytes 20 s after space came back", held())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := v.WriteBlocks(ctx, 100*per, storetest.Pattern(100*per, per, 2), false); err != nil {
		t.Fatalf("write into new clusters with space again: %v", err)
	}
	if _, err := s.CreateSnapshot(ctx, "v", "after"); err != nil {
		t.Fatalf("snapshot with space again: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := l.reopen(t)
	v2, err := s2.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	got := make([]byte, mib)
	for _, m := range []uint64{0, 1, 2, 3, 4, 5, 6, 7, 100} {
		want := storetest.Pattern(m*per, per, 1)
		if m == 100 {
			want = storetest.Pattern(m*per, per, 2)
		} else {
			clear(want[:16*store.BlockSize]) // trimmed
		}
		if err := v2.ReadBlocks(ctx, m*per, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("MiB %d differs from what was written", m)
		}
	}
	info, err := s2.StatVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Snapshots) != snaps+1 {
		t.Fatalf("volume v has %d snapshots after the reopen, want %d", len(info.Snapshots), snaps+1)
	}
	store.CheckThin(t, s2)
}

// loopThin is a thin store, with a 32 MiB reserve, on a 160 MiB ext4 of
// its own.
type loopThin struct {
	mnt, dir string
	s        store.Store // closed when the test ends
}

func openLoopThin(t *testing.T) *loopThin {
	t.Helper()
	mnt := loopfs.Ext4(t, 160<<20)
	l := &loopThin{mnt: mnt, dir: filepath.Join(mnt, "store")}
	l.reopen(t)
	t.Cleanup(func() {
		if l.s != nil {
			l.s.Close()
		}
	})
	return l
}

// reopen closes the store, if open, and opens it again.
func (l *loopThin) reopen(t *testing.T) store.Store {
	t.Helper()
	if l.s != nil {
		if err := l.s.Close(); err != nil {
			t.Fatal(err)
		}
		l.s = nil
	}
	s, err := store.OpenThin(l.dir, store.ThinOptions{Reserve: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	l.s = s
	return s
}

// TestThinWriteZeroesAllocatedOnFullFileSystem: what WriteZeroesAllocated
// zeroed stays writable when the file system under the store is full
// (the NBD specification's promise for NBD_CMD_FLAG_NO_HOLE: later writes
// there do not fail for lack of space), whether it was never written, a
// cluster with a hole punched into it, or data a snapshot shared (copied
// for the volume then). Beside it, what WriteZeroes zeroed, and snapshot
// data not zeroed, fail with ErrNoSpace: they need new space.
func TestThinWriteZeroesAllocatedOnFullFileSystem(t *testing.T) {
	ctx := context.Background()
	l := openLoopThin(t)
	s := l.s
	v := createOpen(t, s, "v", 1<<30)
	const mib = 1 << 20
	const per = mib / store.BlockSize
	// Blocks (in MiBs): 0-1 never written, 2 written then a hole punched
	// in the middle of each cluster, 3 and 4 shared with a snapshot; 0-3
	// zeroed allocated, then 5-6 zeroed plainly.
	for _, m := range []uint64{2, 3, 4, 5} {
		if err := v.WriteBlocks(ctx, m*per, storetest.Pattern(m*per, per, 1), false); err != nil {
			t.Fatal(err)
		}
	}
	for lba := uint64(2 * per); lba < 3*per; lba += 16 {
		if err := v.Trim(ctx, lba+4, 8); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateSnapshot(ctx, "v", "s"); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroesAllocated(ctx, 0, 4*per, true); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(ctx, 5*per, 2*per, true); err != nil {
		t.Fatal(err)
	}
	// Fill the file system from 16 MiB on, then take what is left above
	// the reserve.
	fillClusters(t, v, (fillMiBs(t, v, 16, 2)+1)*per)
	for _, c := range []struct {
		what    string
		lba     uint64
		noSpace bool
	}{
		{"never written, zeroed allocated", 0, false},
		{"never written, zeroed allocated, second MiB", per + 40, false},
		{"punched, zeroed allocated", 2*per + 4, false},
		{"shared with a snapshot, zeroed allocated", 3*per + 17, false},
		{"shared with a snapshot", 4*per + 17, true},
		{"zeroed with WriteZeroes", 5*per + 33, true},
	} {
		err := v.WriteBlocks(ctx, c.lba, storetest.Pattern(c.lba, 4, 4), true)
		if c.noSpace && !errors.Is(err, store.ErrNoSpace) || !c.noSpace && err != nil {
			t.Errorf("16 KiB FUA write on the full file system, %s: %v (want ErrNoSpace: %v)", c.what, err, c.noSpace)
		}
	}
	sv, err := s.OpenVolume(ctx, "v@s")
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	got := make([]byte, mib)
	if err := sv.ReadBlocks(ctx, 3*per, got); err != nil || !bytes.Equal(got, storetest.Pattern(3*per, per, 1)) {
		t.Fatalf("the snapshot's copy of the zeroed MiB: %v (equal: %v)", err, bytes.Equal(got, storetest.Pattern(3*per, per, 1)))
	}
}

// fillMiBs writes whole MiBs of v (64 KiB clusters) from MiB first on
// until the store refuses one with ErrNoSpace, and returns that MiB.
func fillMiBs(t *testing.T, v store.Volume, first, tag uint64) uint64 {
	t.Helper()
	const per = 1 << 20 / store.BlockSize
	for m := first; ; m++ {
		err := v.WriteBlocks(context.Background(), m*per, storetest.Pattern(m*per, per, tag), false)
		if errors.Is(err, store.ErrNoSpace) {
			return m
		}
		if err != nil {
			t.Fatalf("write of MiB %d: %v, want ErrNoSpace", m, err)
		}
	}
}

// fillClusters writes 4 KiB into each 64 KiB cluster of v from lba on
// until the store refuses one with ErrNoSpace: they take what is left
// above the reserve.
func fillClusters(t *testing.T, v store.Volume, lba uint64) {
	t.Helper()
	for i := 0; ; i++ {
		err := v.WriteBlocks(context.Background(), lba, storetest.Pattern(lba, 1, 3), false)
		if errors.Is(err, store.ErrNoSpace) {
			return
		}
		if err != nil || i == 1000 {
			t.Fatalf("4 KiB write %d to a new cluster on a full file system: %v, want ErrNoSpace by now", i, err)
		}
		lba += 16 // the next 64 KiB cluster
	}
}
