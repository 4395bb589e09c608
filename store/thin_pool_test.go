package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openThinVol opens a thin store in a temporary directory and a new volume
// of size bytes in it.
func openThinVol(t *testing.T, name string, size int64) (Store, Volume) {
	t.Helper()
	st, err := OpenThin(t.TempDir(), ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, name, size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return st, v
}

func thinOf(v Volume) *thinVol { return v.(*volume).dev.(*thinDevice).v }

// TestWritebackStartsEarly: writes into new clusters start the data
// files' writeback once they pass writebackBytes, without a flush;
// overwrites in place do not count toward it.
func TestWritebackStartsEarly(t *testing.T) {
	const size = 2 * writebackBytes
	_, v := openThinVol(t, "wb", size)
	pool := thinOf(v).b.pool
	ctx := context.Background()
	buf := bytes.Repeat([]byte{0xa5}, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if err := v.WriteBlocks(ctx, uint64(off/BlockSize), buf, false); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for pool.writebacks.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d MiB written into new clusters, no writeback started", size>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := pool.unflushed.Load()
	for off := int64(0); off < size; off += int64(len(buf)) {
		if err := v.WriteBlocks(ctx, uint64(off/BlockSize), buf, false); err != nil {
			t.Fatal(err)
		}
	}
	if after := pool.unflushed.Load(); after > before {
		t.Fatalf("overwrites in place counted toward writeback: %d bytes before, %d after", before, after)
	}
}

// TestThinTryRead: TryReadBlocks declines what may block (a cluster a
// writer holds, a clone's origin, a request across clusters) and reads
// holes and cached data.
func TestThinTryRead(t *testing.T) {
	st, v := openThinVol(t, "tr", 1<<20)
	ctx := context.Background()
	tv := thinOf(v)
	cb := tv.b.cb
	data := bytes.Repeat([]byte{7}, BlockSize)
	if err := v.WriteBlocks(ctx, 0, data, false); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, BlockSize)
	if !v.TryReadBlocks(0, buf) || !bytes.Equal(buf, data) {
		t.Fatal("TryReadBlocks of a block just written (in the page cache) did not read it")
	}
	buf[0] = 1
	if !v.TryReadBlocks(cb, buf) || !bytes.Equal(buf, make([]byte, BlockSize)) {
		t.Fatal("TryReadBlocks of an unallocated cluster did not read zeros")
	}
	if v.TryReadBlocks(cb-1, make([]byte, 2*BlockSize)) {
		t.Fatal("TryReadBlocks across two clusters read")
	}
	l := &tv.locks[0]
	l.Lock()
	got := v.TryReadBlocks(0, buf)
	l.Unlock()
	if got {
		t.Fatal("TryReadBlocks read a cluster a writer holds")
	}

	if _, err := st.CreateSnapshot(ctx, "tr", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Clone(ctx, "tr", "s", "cl", CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := st.OpenVolume(ctx, "cl")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.TryReadBlocks(0, buf) {
		t.Fatal("TryReadBlocks of a clone's cluster still in its origin read (the origin may need the database)")
	}
	if err := c.ReadBlocks(ctx, 0, buf); err != nil || !bytes.Equal(buf, data) {
		t.Fatalf("ReadBlocks of the clone: %v", err)
	}
}

// TestThinTryWrite: TryWriteBlocks writes in place into a cluster the
// volume alone holds and into a new cluster where nothing shows through
// (committed like any write), and declines (writing nothing) what needs
// more: a cluster shared with a snapshot or still in a clone's origin
// (copy on write), a request across clusters, a cluster another request
// holds.
func TestThinTryWrite(t *testing.T) {
	st, v := openThinVol(t, "tw", 1<<20)
	ctx := context.Background()
	tv := thinOf(v)
	cb := tv.b.cb
	old := bytes.Repeat([]byte{7}, BlockSize)
	if err := v.WriteBlocks(ctx, 0, old, false); err != nil {
		t.Fatal(err)
	}
	read := func(h Volume, lba uint64) []byte {
		t.Helper()
		buf := make([]byte, BlockSize)
		if err := h.ReadBlocks(ctx, lba, buf); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	data := bytes.Repeat([]byte{9}, BlockSize)
	if !v.TryWriteBlocks(1, data) || !bytes.Equal(read(v, 1), data) {
		t.Fatal("TryWriteBlocks into the volume's own cluster did not write")
	}
	if !v.TryWriteBlocks(cb+1, data) || !bytes.Equal(read(v, cb+1), data) || !bytes.Equal(read(v, cb), make([]byte, BlockSize)) {
		t.Fatal("TryWriteBlocks into an unallocated cluster: want it written, the rest of the cluster zeros")
	}
	if tv.m.get(1).phys() == 0 {
		t.Fatal("TryWriteBlocks into an unallocated cluster did not map it")
	}
	if v.TryWriteBlocks(cb-1, make([]byte, 2*BlockSize)) {
		t.Fatal("TryWriteBlocks across two clusters wrote")
	}
	l := &tv.locks[0]
	l.RLock()
	got := v.TryWriteBlocks(2, data)
	l.RUnlock()
	if got {
		t.Fatal("TryWriteBlocks wrote into a cluster a reader holds")
	}

	if _, err := st.CreateSnapshot(ctx, "tw", "s"); err != nil {
		t.Fatal(err)
	}
	if v.TryWriteBlocks(0, data) {
		t.Fatal("TryWriteBlocks wrote into a cluster shared with a snapshot")
	}
	sv, err := st.OpenVolume(ctx, "tw@s")
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	if !bytes.Equal(read(sv, 0), old) {
		t.Fatal("the snapshot's block changed")
	}
	// The copy on write gives the volume its own cluster again.
	if err := v.WriteBlocks(ctx, 0, data, false); err != nil {
		t.Fatal(err)
	}
	if !v.TryWriteBlocks(2, data) || !bytes.Equal(read(v, 2), data) || !bytes.Equal(read(sv, 2), make([]byte, BlockSize)) {
		t.Fatal("TryWriteBlocks after the copy on write: want the volume's block written, the snapshot's not")
	}

	if _, err := st.Clone(ctx, "tw", "s", "cl", CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := st.OpenVolume(ctx, "cl")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.TryWriteBlocks(0, data) || !bytes.Equal(read(c, 0), old) {
		t.Fatal("TryWriteBlocks into a clone's cluster still in its origin wrote")
	}
}

// TestSnapshotBesideDataSync: a snapshot (or any catalog change) commits
// while a commit syncs the data files, instead of waiting for that sync,
// which can take a long time after a burst of writes; the batch's
// replacements reach the database after the snapshot, and the snapshot
// holds what the volume held when it was taken.
func TestSnapshotBesideDataSync(t *testing.T) {
	const size = 8 << 20
	st, v := openThinVol(t, "sds", size)
	ctx := context.Background()
	old := bytes.Repeat([]byte{0x11}, size)
	if err := v.WriteBlocks(ctx, 0, old, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// New clusters in the batch, not yet committed: half of them written
	// again (in place), and a snapshot earlier so that the overwrites of
	// shared clusters are replacements that name a snapshot's delta.
	if _, err := st.CreateSnapshot(ctx, "sds", "before"); err != nil {
		t.Fatal(err)
	}
	cur := bytes.Repeat([]byte{0x22}, size/2)
	if err := v.WriteBlocks(ctx, 0, cur, false); err != nil {
		t.Fatal(err)
	}

	pool := thinOf(v).b.pool
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	pool.syncHook.Store(&hook)
	flushed := make(chan error, 1)
	go func() { flushed <- v.Flush(ctx) }()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the flush never synced the data files")
	}
	snapped := make(chan error, 1)
	go func() {
		_, err := st.CreateSnapshot(ctx, "sds", "during")
		snapped <- err
	}()
	select {
	case err := <-snapped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("the snapshot waited for the data files' sync")
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	// Writes after the snapshot do not show in it.
	if err := v.WriteBlocks(ctx, 0, bytes.Repeat([]byte{0x33}, size), false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	CheckThin(t, st)
	want := append(append([]byte{}, cur...), old[size/2:]...)
	for _, c := range []struct {
		snap string
		want []byte
	}{{"before", old}, {"during", want}} {
		if _, err := st.Clone(ctx, "sds", c.snap, "sds-"+c.snap, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cv, err := st.OpenVolume(ctx, "sds-"+c.snap)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		err = cv.ReadBlocks(ctx, 0, got)
		cv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("snapshot %q does not hold the volume as it was when taken", c.snap)
		}
	}
	CheckThin(t, st)
}

// commitLeakChildEnv names the store directory of TestCrashDuringCommitLeaks's
// child.
const commitLeakChildEnv = "STORE_COMMIT_LEAK_CHILD_DIR"

// TestCrashDuringCommitLeaksChild: the child of TestCrashDuringCommitLeaks.
// A flush commits a write into a new cluster; while it syncs the data files
// (the batch already swapped), another write takes a new cluster past the
// high-water mark, its map change going to the next batch. The flush's
// transaction records the high-water mark as it is then, past that second
// cluster. The process dies before the second write is committed.
func TestCrashDuringCommitLeaksChild(t *testing.T) {
	st := CrashChildStore(t, commitLeakChildEnv)
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "v", 8<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	cb := uint64(DefaultClusterSize / BlockSize)
	if err := v.WriteBlocks(ctx, 0, bytes.Repeat([]byte{1}, BlockSize), false); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	hook := func() {
		once.Do(func() {
			// A writer beside the commit (on the completion handler or a
			// worker): a new cluster, past the high-water mark.
			if !v.TryWriteBlocks(4*cb, bytes.Repeat([]byte{2}, BlockSize)) {
				panic("TryWriteBlocks declined")
			}
		})
	}
	thinOf(v).b.pool.syncHook.Store(&hook)
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	CrashNow()
}

// TestCrashDuringCommitLeaks: after the crash, every cluster below the
// high-water mark is free or referenced (thinBackend.check): the cluster
// the uncommitted write took is not lost for good.
func TestCrashDuringCommitLeaks(t *testing.T) {
	dir := t.TempDir()
	CrashChild(t, "TestCrashDuringCommitLeaksChild", commitLeakChildEnv, dir)
	st, err := OpenThin(dir, ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	CheckThin(t, st)
}

// TestCached: cached tells a range the page cache holds in full from one
// it holds in part or not at all, as pwrite relies on to write a large
// request whole only where that makes no new folio.
func TestCached(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	const n = 1 << 20
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, n), 0); err != nil {
		t.Fatal(err)
	}
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Len: n}, &st, 0); err != nil {
		t.Skipf("cachestat: %v (Linux 6.5 or later): pwrite writes in pieces", err)
	}
	check := func(what string, pos, n int64, want bool) {
		t.Helper()
		if got := cached(fd, pos, n); got != want {
			t.Errorf("%s: cached(%d, %d) = %v, want %v", what, pos, n, got, want)
		}
	}
	check("just written", 0, n, true)
	check("an unaligned part", 1000, 70000, true)
	check("running past the end", n-4096, 8192, false)
	// Written back and dropped, then the first 64 KiB read again alone
	// (no readahead).
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(fd, 0, n, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if cached(fd, 0, 4096) {
		t.Skip("the kernel kept the pages FADV_DONTNEED dropped")
	}
	check("dropped", 0, n, false)
	if err := unix.Fadvise(fd, 0, n, unix.FADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	check("read again", 0, 64<<10, true)
	check("read again and beyond", 0, 128<<10, false)
}

// TestConcurrentWritesAndPunches: writes and hole punches from many
// goroutines into one data file leave every block as its last writer left
// it.
func TestConcurrentWritesAndPunches(t *testing.T) {
	const workers, rounds, per = 8, 200, 16 // blocks per worker: one 64 KiB cluster
	_, v := openThinVol(t, "wl", workers*per*BlockSize)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			base := uint64(w * per)
			for r := range rounds {
				err := v.WriteBlocks(ctx, base+uint64(r%per), bytes.Repeat([]byte{byte(w + 1)}, BlockSize), false)
				if err == nil && r%per == per-1 { // trim a block in the middle of the cluster: a hole punch
					err = v.Trim(ctx, base+per/2, 1)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, workers*per*BlockSize)
	if err := v.ReadBlocks(ctx, 0, got); err != nil {
		t.Fatal(err)
	}
	// The last trim (round 191) came after block per/2's last write (184)
	// and every other block was written last after it or never trimmed.
	for w := range workers {
		for i := range per {
			want := bytes.Repeat([]byte{byte(w + 1)}, BlockSize)
			if i == per/2 {
				want = make([]byte, BlockSize)
			}
			if blk := got[(w*per+i)*BlockSize:][:BlockSize]; !bytes.Equal(blk, want) {
				t.Fatalf("worker %d block %d starts %#x, want %#x", w, i, blk[0], want[0])
			}
		}
	}
}
