package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

func openThin(t *testing.T) store.Store {
	s, err := store.OpenThin(t.TempDir(), store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestThinConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{Open: openThin})
}

// TestRawConformance runs the suite over raw volumes: every volume the
// suite makes is a new sparse file served as it is.
func TestRawConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{
		Open: openThin,
		Create: func(t *testing.T, name string, size int64) (int64, store.CreateOptions) {
			if size <= 0 || size%store.BlockSize != 0 {
				return size, store.CreateOptions{} // the suite checks the store's own refusal
			}
			path := filepath.Join(t.TempDir(), "raw-"+filepath.Base(name)+".img")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, size); err != nil {
				t.Fatal(err)
			}
			return 0, store.CreateOptions{Raw: path}
		},
		NoSnapshots: true,
		NoResize:    true,
	})
}

func TestMemoryModel(t *testing.T) {
	storetest.Model(t, storetest.ModelOptions{Open: func(*testing.T) store.Store { return store.NewMemory() }, Steps: modelSteps})
}

// TestThinModel runs the model with clusters of 4 blocks, so requests
// cover whole and partial clusters, and with the default size; and with
// clusters of 4 blocks in data files of 16 clusters, so that requests and
// copies span data files (a store's clusters past its first TiB). With the
// small clusters the volume records are not cached (DisableRecordCache):
// every lookup decodes its record and loads its snapshots; with the
// default size they are, as in service, so the model checks the cache's
// answers. Likewise a snapshot's view is resolved a window at a time with
// the small clusters whatever the snapshot count (SetViewWindowFrom), and
// as in service with the default size.
func TestThinModel(t *testing.T) {
	for _, c := range []struct {
		cs    int64
		files int64 // data file size, 0: the default (1 TiB)
	}{{16 << 10, 0}, {store.DefaultClusterSize, 0}, {16 << 10, 256 << 10}} {
		cs := c.cs
		name := strconv.FormatInt(cs>>10, 10) + "K"
		if c.files != 0 {
			name += "-files" + strconv.FormatInt(c.files>>10, 10) + "K"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := store.SmallDataFiles(store.ThinOptions{ClusterSize: cs}, c.files)
			open := func(t *testing.T) store.Store {
				s, err := store.OpenThin(dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				if cs != store.DefaultClusterSize {
					store.DisableRecordCache(s)
					store.SetViewWindowFrom(s, 1)
				}
				return s
			}
			thinModel(t, open)
		})
	}
}

// thinModel runs the model over the thin store open opens, reopening it
// (close, open) where the model says and checking its invariants.
func thinModel(t *testing.T, open func(*testing.T) store.Store) {
	storetest.Model(t, storetest.ModelOptions{
		Open: open,
		Reopen: func(t *testing.T, s store.Store) store.Store {
			if err := s.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			return open(t)
		},
		Check: store.CheckThin,
		Steps: modelSteps,
	})
}

// TestThinTryReadAllocs: TryReadBlocks, the completion handler's read,
// allocates nothing.
func TestThinTryReadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	st := openThin(t)
	defer st.Close()
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "al", 1<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, "al")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	buf := make([]byte, store.BlockSize)
	if err := v.WriteBlocks(ctx, 3, buf, false); err != nil {
		t.Fatal(err)
	}
	if !v.TryReadBlocks(3, buf) {
		t.Fatal("TryReadBlocks of a block just written (in the page cache) did not read it")
	}
	if n := testing.AllocsPerRun(100, func() { v.TryReadBlocks(3, buf) }); n != 0 {
		t.Fatalf("TryReadBlocks allocates %v times per call", n)
	}
}

// TestThinSnapshotsBetweenCommitTransactions takes snapshots of a volume
// under copy-on-write writes while commits run, each batch op in its own
// transaction, so that snapshots commit between the transactions of one
// batch. Every snapshot must hold, per block, a write acknowledged no
// later than the snapshot returned and started no earlier than it was
// asked for; after the store is closed and opened again the snapshots and
// the head read the same, and the metadata checks out.
func TestThinSnapshotsBetweenCommitTransactions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := store.ThinOptions{ClusterSize: 16 << 10}
	s, err := store.OpenThin(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	store.SetCommitChunk(s, 1)
	const n, writers, snaps = 1024, 2, 16
	const bs = store.BlockSize
	if _, err := s.CreateVolume(ctx, "live", n*bs, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "live")
	if err != nil {
		t.Fatal(err)
	}
	tw := storetest.StartTagWriters(ctx, v, n, writers)
	// Commits one after the other, through another volume: a Flush of
	// live would hold off its snapshots until the commit ends.
	if _, err := s.CreateVolume(ctx, "other", bs, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := s.OpenVolume(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	stop, flushed := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				flushed <- nil
				return
			default:
			}
			if err := other.Flush(ctx); err != nil {
				flushed <- err
				return
			}
		}
	}()
	readAll := func(s store.Store, name string) []byte {
		t.Helper()
		rv, err := s.OpenVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer rv.Close()
		data := make([]byte, n*bs)
		if err := rv.ReadBlocks(ctx, 0, data); err != nil {
			t.Fatal(err)
		}
		return data
	}
	// The bounds of each snapshot are taken as it is made, its blocks
	// read after the last one: snapshots follow one another closely, to
	// fall inside commits.
	var lo, hi [snaps][]uint64
	for i := range snaps {
		lo[i] = storetest.Load(tw.Acked)
		if _, err := s.CreateSnapshot(ctx, "live", "s"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		hi[i] = storetest.Load(tw.Started)
		time.Sleep(time.Millisecond) // let the writers copy on write
	}
	close(stop)
	if err := errors.Join(tw.Stop(), <-flushed); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]byte{}
	for i := range snaps {
		name := "live@s" + strconv.Itoa(i)
		data := readAll(s, name)
		if err := storetest.CheckTags(data, lo[i], hi[i]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		seen[name] = data
	}
	seen["live"] = readAll(s, "live")
	for _, h := range []store.Volume{v, other} {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
	store.CheckThin(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = store.OpenThin(dir, opts); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	store.CheckThin(t, s)
	for name, want := range seen {
		if got := readAll(s, name); !bytes.Equal(got, want) {
			t.Errorf("%s reads otherwise after the store was opened again", name)
		}
	}
}

// TestThinHugeVolume: a thin volume as large as the store allows (64 PiB
// with the default clusters) is created, opened, written at both ends,
// snapshotted, cloned and reopened without memory in proportion to its
// size (its map was once a slice of page pointers made at open: 8 GiB for
// this one, and a 100 PiB volume took the daemon down at its first
// login); one block more is refused with ErrInvalid, at create and at
// resize.
func TestThinHugeVolume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	const largest = int64(1) << 56 // 2^40 clusters of 64 KiB
	if _, err := s.CreateVolume(ctx, "over", largest+store.BlockSize, store.CreateOptions{}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("create past the largest size: %v, want ErrInvalid", err)
	}
	if _, err := s.CreateVolume(ctx, "huge", largest, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.ResizeVolume(ctx, "huge", largest+store.BlockSize); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("resize past the largest size: %v, want ErrInvalid", err)
	}
	last := uint64(largest/store.BlockSize) - 1
	blocks := map[uint64]byte{0: 0x11, last / 2: 0x22, last: 0x33}
	check := func(name string, want map[uint64]byte) {
		t.Helper()
		v, err := s.OpenVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		buf := make([]byte, store.BlockSize)
		for lba, b := range want {
			if err := v.ReadBlocks(ctx, lba, buf); err != nil {
				t.Fatalf("%s: read block %d: %v", name, lba, err)
			}
			if buf[0] != b || buf[store.BlockSize-1] != b {
				t.Fatalf("%s: block %d holds %#x, want %#x", name, lba, buf[0], b)
			}
		}
		// The allocated extents: of the whole volume for the volume
		// itself, which skips unmapped space by the directory; around
		// each written block for a snapshot or a clone, which resolve
		// cluster by cluster (a request's length is bounded by the
		// protocols: 4 GiB for NBD).
		var data []uint64
		collect := func(lba, count uint64) {
			err := v.BlockStatus(ctx, lba, count, func(e store.Extent) bool {
				if !e.Hole {
					data = append(data, e.LBA)
				}
				return true
			})
			if err != nil {
				t.Fatalf("%s: block status at %d: %v", name, lba, err)
			}
		}
		if name == "huge" {
			for lba := uint64(0); lba <= last; lba += 1 << 50 / store.BlockSize {
				collect(lba, min(1<<50/store.BlockSize, last+1-lba))
			}
		} else {
			for lba := range want {
				from := max(lba, 1<<20) - 1<<20
				collect(from, min(lba+1<<20, last+1)-from)
			}
		}
		if len(data) != len(want) {
			t.Fatalf("%s: %d allocated extents at %v, want %d", name, len(data), data, len(want))
		}
	}
	v, err := s.OpenVolume(ctx, "huge")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, store.BlockSize)
	for lba, b := range blocks {
		for i := range buf {
			buf[i] = b
		}
		if err := v.WriteBlocks(ctx, lba, buf, false); err != nil {
			t.Fatalf("write block %d: %v", lba, err)
		}
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	v.Close()
	if _, err := s.CreateSnapshot(ctx, "huge", "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Clone(ctx, "huge", "s", "copy", store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("huge", blocks)
	check("huge@s", blocks)
	check("copy", blocks)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = store.OpenThin(dir, store.ThinOptions{}); err != nil {
		t.Fatal(err)
	}
	check("huge", blocks)
	check("copy", blocks)
	store.CheckThin(t, s)
}

// createRaw makes a sparse 1 MiB file at img, creates raw volume name on
// it in s and opens it.
func createRaw(t *testing.T, s store.Store, name, img string) store.Volume {
	t.Helper()
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 1<<20); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.CreateVolume(ctx, name, 0, store.CreateOptions{Raw: img}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRawSyncFailure: once an fdatasync of a raw volume's file failed, the
// volume refuses writes, trims and flushes, also through handles opened
// afterwards and although the next fdatasync would succeed (the kernel
// reports a write-back error once, and may have dropped the pages it
// could not write: a later successful flush would vouch for writes that
// are lost); reads go on; a reopened store serves it again.
func TestRawSyncFailure(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	img := filepath.Join(t.TempDir(), "raw.img")
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := createRaw(t, s, "r", img)
	block := bytes.Repeat([]byte{0x5a}, store.BlockSize)
	if err := v.WriteBlocks(ctx, 0, block, false); err != nil {
		t.Fatal(err)
	}
	store.FailRawSyncOnce(s, syscall.EIO)
	if err := v.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush with a failing fdatasync: %v, want EIO", err)
	}
	refused := func(v store.Volume, when string) {
		t.Helper()
		for op, err := range map[string]error{
			"write":     v.WriteBlocks(ctx, 1, block, false),
			"FUA write": v.WriteBlocks(ctx, 1, block, true),
			"trim":      v.Trim(ctx, 2, 1),
			"flush":     v.Flush(ctx),
		} {
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "refuses writes and flushes") {
				t.Errorf("%s %s: %v, want refused with the fdatasync's EIO", op, when, err)
			}
		}
		got := make([]byte, store.BlockSize)
		if err := v.ReadBlocks(ctx, 0, got); err != nil || !bytes.Equal(got, block) {
			t.Errorf("read %s: %v (data equal: %v)", when, err, bytes.Equal(got, block))
		}
	}
	health := func(when string, want bool) {
		t.Helper()
		err := s.(store.HealthChecker).Health()
		if got := err != nil && errors.Is(err, syscall.EIO) && strings.Contains(err.Error(), `raw volume "r"`); got != want {
			t.Errorf("Health %s: %v, want an error naming the volume: %v", when, err, want)
		}
	}
	refused(v, "after the failure")
	health("after the failure", true)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	health("with no handle open", true)
	v, err = s.OpenVolume(ctx, "r") // the last handle went: a new file descriptor
	if err != nil {
		t.Fatal(err)
	}
	refused(v, "through a new handle")
	v.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	health("after the store was reopened", false)
	v, err = s.OpenVolume(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.WriteBlocks(ctx, 1, block, true); err != nil {
		t.Fatalf("write after the store was reopened: %v", err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("flush after the store was reopened: %v", err)
	}
}

// TestRawConcurrentFlushFailure: flushes of a raw volume that overlap a
// failing fdatasync all fail. The kernel reports a write-back error to the
// open file once: an fdatasync made beside the failing one would succeed
// with its writes lost, so the volume makes one at a time and shares it.
func TestRawConcurrentFlushFailure(t *testing.T) {
	ctx := context.Background()
	s := openThin(t)
	defer s.Close()
	v := createRaw(t, s, "r", filepath.Join(t.TempDir(), "raw.img"))
	defer v.Close()
	entered, fail := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	store.SetRawSyncHook(s, func() error {
		if calls.Add(1) == 1 {
			close(entered)
			<-fail
			return syscall.EIO
		}
		return nil // what the kernel tells the next fdatasync
	})
	const flushers = 4
	errs := make(chan error, flushers)
	go func() { errs <- v.WriteBlocks(ctx, 0, make([]byte, store.BlockSize), true) }()
	<-entered // the first fdatasync runs
	for i := 1; i < flushers; i++ {
		go func() {
			if i%2 == 0 {
				errs <- v.Flush(ctx)
			} else {
				errs <- v.WriteBlocks(ctx, uint64(i), make([]byte, store.BlockSize), true)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // let them reach the store
	close(fail)
	for range flushers {
		if err := <-errs; !errors.Is(err, syscall.EIO) {
			t.Errorf("a flush or FUA write beside a failing fdatasync: %v, want EIO", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d fdatasyncs, want 1 (the others fail on the first's error)", n)
	}
}

// TestMetaSyncFailureFailsStore: a failed sync of the metadata database,
// here a snapshot's, fails the store: later flushes and changes are
// refused, though the next sync would succeed (the kernel reports a
// write-back error to an open file once: a commit synced after it would
// vouch for metadata that is lost). Reads go on.
func TestMetaSyncFailureFailsStore(t *testing.T) {
	ctx := context.Background()
	s := openThin(t)
	defer s.Close()
	v := createOpen(t, s, "v", 1<<20)
	defer v.Close()
	block := bytes.Repeat([]byte{0x7e}, store.BlockSize)
	if err := v.WriteBlocks(ctx, 0, block, true); err != nil {
		t.Fatal(err)
	}
	store.FailMetaSyncOnce(s, syscall.EIO)
	if _, err := s.CreateSnapshot(ctx, "v", "s1"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("snapshot with a failing metadata sync: %v, want EIO", err)
	}
	if err := v.WriteBlocks(ctx, 1, block, false); err == nil {
		if err := v.Flush(ctx); !errors.Is(err, syscall.EIO) {
			t.Errorf("flush after a failed metadata sync: %v, want the failure (EIO)", err)
		}
	} else if !errors.Is(err, syscall.EIO) {
		t.Errorf("write after a failed metadata sync: %v, want the failure (EIO)", err)
	}
	if _, err := s.CreateSnapshot(ctx, "v", "s2"); !errors.Is(err, syscall.EIO) {
		t.Errorf("snapshot after a failed metadata sync: %v, want the failure (EIO)", err)
	}
	if err := s.(store.HealthChecker).Health(); !errors.Is(err, syscall.EIO) {
		t.Errorf("Health after a failed metadata sync: %v, want the failure (EIO)", err)
	}
	got := make([]byte, store.BlockSize)
	if err := v.ReadBlocks(ctx, 0, got); err != nil || !bytes.Equal(got, block) {
		t.Errorf("read after a failed metadata sync: %v (data equal: %v)", err, bytes.Equal(got, block))
	}
}

// TestRawRefusals: a raw volume may not be a file of the store itself
// (directly or through a symlink), nor the file of another raw volume
// (through another name); a block device is claimed exclusively, so one
// with a mounted file system is refused and one being served cannot be
// mounted or claimed again (as root, with losetup; skipped otherwise).
func TestRawRefusals(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	inside := filepath.Join(dir, "data", "inside.img")
	if err := os.WriteFile(inside, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link.img")
	if err := os.Symlink(inside, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{inside, link} {
		if _, err := s.CreateVolume(ctx, "r", 0, store.CreateOptions{Raw: p}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("raw volume on %s, in the store's directory: %v, want ErrInvalid", p, err)
		}
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "r1", 0, store.CreateOptions{Raw: img}); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(filepath.Dir(img), "hard.img")
	if err := os.Link(img, hard); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "r2", 0, store.CreateOptions{Raw: hard}); !errors.Is(err, store.ErrExists) || !strings.Contains(err.Error(), `"r1"`) {
		t.Fatalf("a second raw volume on r1's file: %v, want ErrExists naming r1", err)
	}

	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("block devices: %s not installed", tool)
		}
	}
	loop := loopDevice(t, 64<<20)
	mnt := t.TempDir()
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", loop}, {"mount", loop, mnt}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	_, err = s.CreateVolume(ctx, "mounted", 0, store.CreateOptions{Raw: loop})
	if out, uerr := exec.Command("umount", mnt).CombinedOutput(); uerr != nil {
		t.Fatalf("umount: %v\n%s", uerr, out)
	}
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("raw volume on a mounted device: %v, want it refused as in use", err)
	}
	if _, err := s.CreateVolume(ctx, "dev", 0, store.CreateOptions{Raw: loop}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", loop, mnt).CombinedOutput(); err == nil {
		exec.Command("umount", mnt).Run()
		t.Fatalf("mounted the device of a served raw volume\n%s", out)
	}
	v.Close()
	if out, err := exec.Command("mount", loop, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount after the volume closed: %v\n%s", err, out)
	}
	exec.Command("umount", mnt).Run()
}

// TestRawRefusalsRelativePaths: the refusal of a raw volume inside the
// store's directory holds whichever of the two paths is relative: a store
// opened as "rtarget-data" (rtarget's default --data is relative) given the
// absolute path the volume commands send, or a store opened by an absolute
// path given a relative one.
func TestRawRefusalsRelativePaths(t *testing.T) {
	ctx := context.Background()
	work := t.TempDir()
	t.Chdir(work)
	for _, c := range []struct{ dir, raw string }{
		{"rel-store", filepath.Join(work, "rel-store", "data", "000000.data")},
		{filepath.Join(work, "abs-store"), filepath.Join("abs-store", "data", "000000.data")},
	} {
		s := thinWithData(t, c.dir)
		if _, err := s.CreateVolume(ctx, "r", 0, store.CreateOptions{Raw: c.raw}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("store %s: raw volume on its own data file %s: %v, want ErrInvalid", c.dir, c.raw, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestThinExclusiveAfterRollback: the clusters a rollback gave the head
// from a snapshot count as the head's Exclusive once that snapshot is
// deleted and no other reference to them is left: deleting the volume
// alone would then free them (Exclusive's definition; the memory store
// counts them so too).
func TestThinExclusiveAfterRollback(t *testing.T) {
	ctx := context.Background()
	s := openThin(t)
	defer s.Close()
	const size = 1 << 20
	if _, err := s.CreateVolume(ctx, "v", size, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	write := func(tag uint64) {
		t.Helper()
		v, err := s.OpenVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		if err := v.WriteBlocks(ctx, 0, storetest.Pattern(0, size/store.BlockSize, tag), false); err != nil {
			t.Fatal(err)
		}
	}
	write(1)
	if _, err := s.CreateSnapshot(ctx, "v", "r"); err != nil {
		t.Fatal(err)
	}
	write(2)
	if err := s.Rollback(ctx, "v", "r"); err != nil {
		t.Fatal(err)
	}
	st, err := s.StatVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if st.Allocated != size || st.Exclusive != 0 {
		t.Fatalf("after the rollback (the snapshot shares every cluster): allocated %d, exclusive %d", st.Allocated, st.Exclusive)
	}
	if err := s.DeleteSnapshot(ctx, "v", "r"); err != nil {
		t.Fatal(err)
	}
	if st, err = s.StatVolume(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if st.Allocated != size || st.Exclusive != size {
		t.Fatalf("after the snapshot's deletion (the head alone holds every cluster): allocated %d, exclusive %d, want %d",
			st.Allocated, st.Exclusive, size)
	}
	store.CheckThin(t, s)
}

// TestRawDeviceListedWhileServed: a raw volume on a block device is
// listed and stated while it is open (served), which holds the device
// exclusively, and so is every other volume beside it (as root, with
// losetup; skipped otherwise).
func TestRawDeviceListedWhileServed(t *testing.T) {
	ctx := context.Background()
	s := openThin(t)
	defer s.Close()
	loop := loopDevice(t, 16<<20)
	if _, err := s.CreateVolume(ctx, "dev", 0, store.CreateOptions{Raw: loop}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "thin", 1<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	vs, err := s.ListVolumes(ctx)
	if err != nil {
		t.Fatalf("list while the raw device is served: %v", err)
	}
	if len(vs) != 2 || vs[0].Name != "dev" || vs[0].Allocated != 16<<20 {
		t.Fatalf("list while the raw device is served: %+v", vs)
	}
	if st, err := s.StatVolume(ctx, "dev"); err != nil || st.Allocated != 16<<20 {
		t.Fatalf("stat while the raw device is served: %v, allocated %d", err, st.Allocated)
	}
}

// TestRawDeviceWriteZeroesAllocated: on a raw volume that is a block
// device, WriteZeroesAllocated zeroes the blocks on the device itself
// (fallocate ZERO_RANGE, the kernel's zero-out without unmapping): over
// data and over blocks never written they read as zeros, and a loop
// device passes that on to its sparse file as allocated blocks, which a
// discard would have punched (as root, with losetup; skipped otherwise).
func TestRawDeviceWriteZeroesAllocated(t *testing.T) {
	ctx := context.Background()
	s := openThin(t)
	defer s.Close()
	loop, img := loopDeviceImage(t, 16<<20)
	if _, err := s.CreateVolume(ctx, "dev", 0, store.CreateOptions{Raw: loop}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	data := bytes.Repeat([]byte{0x5a}, 1<<20)
	if err := v.WriteBlocks(ctx, 0, data, true); err != nil {
		t.Fatal(err)
	}
	const at, n = 1 << 20 / store.BlockSize / 2, 2 << 20 / store.BlockSize // half data, half never written
	if err := v.WriteZeroesAllocated(ctx, at, n, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4<<20)
	if err := v.ReadBlocks(ctx, 0, got); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		want := byte(0)
		if i < at*store.BlockSize {
			want = 0x5a
		}
		if b != want {
			t.Fatalf("byte %d reads %#x, want %#x", i, b, want)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if want := int64(at+n) * store.BlockSize; st.Blocks*512 < want {
		t.Fatalf("the loop device's file holds %d bytes, want at least %d: the zeroed blocks were not kept allocated",
			st.Blocks*512, want)
	}
}

// TestNewDataFileSyncsDirectory: a data file's name is made durable (its
// directory fsynced) before the commit that maps clusters into it, once
// per new file; a failed directory sync fails that commit and the store.
func TestNewDataFileSyncsDirectory(t *testing.T) {
	ctx := context.Background()
	const cs = 16 << 10
	s, err := store.OpenThin(t.TempDir(), store.SmallDataFiles(store.ThinOptions{ClusterSize: cs}, 16*cs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var syncs atomic.Int32
	var fail atomic.Pointer[error]
	store.SetDataDirSyncHook(s, func() error {
		if err := fail.Swap(nil); err != nil {
			return *err
		}
		syncs.Add(1)
		return nil
	})
	v := createOpen(t, s, "v", 1<<20)
	defer v.Close()
	block := bytes.Repeat([]byte{0x5a}, store.BlockSize)
	perCluster := uint64(cs / store.BlockSize)
	// Clusters are handed out in order from the first past the header's
	// room: the volume's clusters 0-15 fill a data file, 16-31 the next.
	for c := range uint64(32) {
		if err := v.WriteBlocks(ctx, c*perCluster, block, true); err != nil {
			t.Fatalf("write to cluster %d: %v", c, err)
		}
		if got, want := syncs.Load(), int32(1+c/16); got != want {
			t.Fatalf("after a write to cluster %d: %d directory fsyncs, want %d", c, got, want)
		}
	}
	eio := error(syscall.EIO)
	fail.Store(&eio)
	if err := v.WriteBlocks(ctx, 32*perCluster, block, true); !errors.Is(err, syscall.EIO) {
		t.Fatalf("FUA write into a new data file whose directory sync fails: %v, want EIO", err)
	}
	if err := v.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("flush after a failed directory sync: %v, want the failure (EIO)", err)
	}
	got := make([]byte, store.BlockSize)
	if err := v.ReadBlocks(ctx, 16*perCluster, got); err != nil || !bytes.Equal(got, block) {
		t.Errorf("read after a failed directory sync: %v (data equal: %v)", err, bytes.Equal(got, block))
	}
}

// TestRawStoreSyncWaitsForRoundInFlight: Store.Sync (the store-wide sync
// behind a clean shutdown) returns only once what the raw volumes were
// written is durable, also when it meets an fdatasync round that started
// before it and has not finished: that round cleared the volume's record
// of unsynced writes when it began, which must not let Sync skip the
// volume before the round ends.
func TestRawStoreSyncWaitsForRoundInFlight(t *testing.T) {
	ctx := context.Background()
	s, err := store.OpenThin(filepath.Join(t.TempDir(), "store"), store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v := createRaw(t, s, "r", filepath.Join(t.TempDir(), "raw.img"))
	defer v.Close()
	if err := v.WriteBlocks(ctx, 0, bytes.Repeat([]byte{0x5a}, store.BlockSize), false); err != nil {
		t.Fatal(err)
	}
	// The first fdatasync round waits for release; later ones pass.
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	store.SetRawSyncHook(s, func() error {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return nil
	})
	flushed := make(chan error, 1)
	go func() { flushed <- v.Flush(ctx) }()
	<-entered // the round is in flight, past its start
	synced := make(chan error, 1)
	go func() { synced <- s.Sync(ctx) }()
	select {
	case err := <-synced:
		close(release)
		t.Fatalf("Sync returned (%v) while the fdatasync round that began before it was still running", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n < 2 {
		t.Fatalf("%d fdatasync rounds, want Sync's own after the one in flight", n)
	}
}

// TestRawRefusalsOtherNamesOfStoreFiles: a raw volume on a store file is
// refused also when its path is outside the store's directory, by a hard
// link to the data file or to a metadata file, or through a bind mount of
// the directory: the path check alone let writes through the volume
// overwrite the store's own data.
func TestRawRefusalsOtherNamesOfStoreFiles(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	dir := filepath.Join(base, "store")
	s := thinWithData(t, dir)
	defer s.Close()
	outside := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, rel := range []string{filepath.Join("data", "000000.data"), filepath.Join("data", "ballast")} {
		if _, err := os.Stat(filepath.Join(dir, rel)); err == nil {
			targets = append(targets, rel)
		}
	}
	metas, _ := filepath.Glob(filepath.Join(dir, "*", "*.vlog"))
	for _, m := range metas {
		rel, _ := filepath.Rel(dir, m)
		targets = append(targets, rel)
	}
	if len(targets) < 2 {
		t.Fatalf("store files to link to: %v, want the data file and a metadata file", targets)
	}
	for i, rel := range targets {
		link := filepath.Join(outside, fmt.Sprintf("link%d.img", i))
		if err := os.Link(filepath.Join(dir, rel), link); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateVolume(ctx, fmt.Sprintf("r%d", i), 0, store.CreateOptions{Raw: link}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("raw volume on %s, a hard link to the store's %s: %v, want ErrInvalid", link, rel, err)
		}
	}

	mnt := filepath.Join(base, "bind")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Logf("bind mount: %v (not root?): that case not checked", err)
		return
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	through := filepath.Join(mnt, "data", "000000.data")
	if _, err := s.CreateVolume(ctx, "bound", 0, store.CreateOptions{Raw: through}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("raw volume on %s, the data file through a bind mount: %v, want ErrInvalid", through, err)
	}
}

// thinWithData opens a thin store in dir with a volume "thin" whose first
// block is written and synced: data in the data file, which a raw volume on
// that file would overwrite.
func thinWithData(t *testing.T, dir string) store.Store {
	t.Helper()
	ctx := context.Background()
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "thin", 1<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "thin")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.WriteBlocks(ctx, 0, storetest.Pattern(0, 1, 1), true); err != nil {
		t.Fatal(err)
	}
	v.Close()
	return s
}
