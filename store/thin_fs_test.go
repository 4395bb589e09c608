package store_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/internal/loopfs"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

// TestThinOnXFS runs the thin store's model (16 KiB clusters, so that
// requests cover whole and partial clusters, with reopens and the
// invariant check) on XFS, where the data files are written without the
// 64 KiB bound ext4 needs and their new clusters' blocks are allocated
// ahead; it checks the bound on each file system, and that a write into
// new space on XFS allocated a step ahead that reads as zeros.
func TestThinOnXFS(t *testing.T) {
	for _, fs := range []struct {
		name  string
		mount func(testing.TB, int64) string
		chunk int64
	}{{"xfs", loopfs.XFS, 0}, {"ext4", loopfs.Ext4, 64 << 10}} {
		t.Run(fs.name, func(t *testing.T) {
			// 8 GiB (sparse): allocAhead takes its 1 GiB steps only
			// with twice that above the reserve.
			mnt := fs.mount(t, 8<<30)
			dir := filepath.Join(mnt, "store")
			opts := store.ThinOptions{ClusterSize: 16 << 10, Reserve: 32 << 20}
			open := func(t *testing.T) store.Store {
				s, err := store.OpenThin(dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				if got := store.WriteChunk(s); got != fs.chunk {
					t.Fatalf("data files on %s written in pieces of at most %d bytes, want %d", fs.name, got, fs.chunk)
				}
				return s
			}
			if fs.name != "xfs" {
				if err := open(t).Close(); err != nil {
					t.Fatal(err)
				}
				return // the model runs on ext4 in TestThinModel
			}
			thinModel(t, open)

			// A write into new space on XFS allocates the data file's
			// blocks ahead: a whole step, read back as zeros.
			s, err := store.OpenThin(filepath.Join(mnt, "ahead"), opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := s.CreateVolume(ctx, "a", 64<<20, store.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			v, err := s.OpenVolume(ctx, "a")
			if err != nil {
				s.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() { v.Close(); s.Close() }) // the last ones opened
			data := storetest.Pattern(3, 1, 1)
			if err := v.WriteBlocks(ctx, 3, data, false); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(mnt, "ahead", "data", "000000.data"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Blocks*512 < 1<<30 {
				t.Fatalf("the data file holds %d bytes of blocks after a write into new space, want the 1 GiB allocated ahead",
					st.Blocks*512)
			}
			buf := make([]byte, 8*store.BlockSize)
			if err := v.ReadBlocks(ctx, 0, buf); err != nil {
				t.Fatal(err)
			}
			for i := range 8 {
				want := make([]byte, store.BlockSize)
				if i == 3 {
					want = data
				}
				if !bytes.Equal(buf[i*store.BlockSize:(i+1)*store.BlockSize], want) {
					t.Fatalf("block %d reads wrong after the allocation ahead", i)
				}
			}

			// Space given back stays given back: after a trim and a
			// reopen, a write into a freed cluster allocates that
			// cluster, not the freed space around it.
			blocks := func() int64 {
				t.Helper()
				var st unix.Stat_t
				if err := unix.Stat(filepath.Join(mnt, "ahead", "data", "000000.data"), &st); err != nil {
					t.Fatal(err)
				}
				return st.Blocks * 512
			}
			const n = 64 << 20 / store.BlockSize
			if err := v.WriteBlocks(ctx, 0, storetest.Pattern(0, 16<<20/store.BlockSize, 2), false); err != nil {
				t.Fatal(err)
			}
			if err := v.Trim(ctx, 0, n); err != nil {
				t.Fatal(err)
			}
			if err := v.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err = store.OpenThin(filepath.Join(mnt, "ahead"), opts); err != nil {
				t.Fatal(err)
			}
			if v, err = s.OpenVolume(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			before := blocks()
			t.Logf("data file blocks after the trim and reopen: %d", before)
			if err := v.WriteBlocks(ctx, 100, data, false); err != nil {
				t.Fatal(err)
			}
			t.Logf("after the write: %d", blocks())
			if grew := blocks() - before; grew > opts.ClusterSize {
				t.Fatalf("a 4 KiB write after a trim and a reopen took %d bytes of blocks, want at most a cluster (%d)",
					grew, opts.ClusterSize)
			}
		})
	}
}

// TestCloseOnDeadFileSystem: a thin store whose file system died (shut
// down as by a power cut: every I/O fails with EIO) fails its writes and
// flushes and still closes, with an error. badger retries the flush of a
// memtable forever, once a second, so a close that waited for it never
// returned, and rtarget hung on SIGTERM.
func TestCloseOnDeadFileSystem(t *testing.T) {
	fs := loopfs.Ext4FS(t, 256<<20)
	ctx := context.Background()
	s := openThinOn(t, fs)
	v := createOpen(t, s, "v", 64<<20)
	buf := bytes.Repeat([]byte{0x5a}, 1<<20)
	for i := range 8 { // map changes in badger's memtable
		if err := v.WriteBlocks(ctx, uint64(i)*512, buf[:64<<10], false); err != nil {
			t.Fatal(err)
		}
		if err := v.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.PowerCut(); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteBlocks(ctx, 8<<10, buf, true); err == nil {
		t.Fatal("a FUA write on a dead file system succeeded")
	}
	if err := v.Flush(ctx); err == nil {
		t.Fatal("a flush on a dead file system succeeded")
	}
	closed := make(chan error, 1)
	go func() {
		v.Close()
		closed <- s.Close()
	}()
	select {
	case err := <-closed:
		if err == nil {
			t.Fatal("the store closed without an error on a dead file system")
		}
		t.Logf("close: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the store did not close within 30 s of its file system dying")
	}
}

// openThinOn opens a thin store in fs, logging to the test. A store whose
// file system dies may leave its database open, retrying a flush until
// the test binary exits: its log goes to the test's while it runs, then
// nowhere.
func openThinOn(t *testing.T, fs *loopfs.FS) store.Store {
	t.Helper()
	logs := &testLog{t: t}
	t.Cleanup(logs.stop)
	s, err := store.OpenThin(filepath.Join(fs.Dir, "store"), store.ThinOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testLog is an io.Writer that logs to its test until stop.
type testLog struct {
	mu sync.Mutex
	t  *testing.T
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.t != nil {
		l.t.Logf("%s", bytes.TrimSuffix(p, []byte("\n")))
	}
	return len(p), nil
}

func (l *testLog) stop() {
	l.mu.Lock()
	l.t = nil
	l.mu.Unlock()
}

// TestRawSyncAndClose: Store.Sync makes what the open raw volumes were
// written durable, and closing a raw volume's last handle syncs it: after
// a power cut of the file system that holds the raw file (the store's own
// directory elsewhere) the blocks written before either are there; a block
// written after the last sync, through a handle still open at the cut, is
// not (the cut is a real one), and that handle's close reports the sync
// it could not make.
func TestRawSyncAndClose(t *testing.T) {
	fs := loopfs.Ext4FS(t, 256<<20)
	ctx := context.Background()
	img := filepath.Join(fs.Dir, "raw.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	unix.Sync() // the file itself is durable
	dir := t.TempDir()
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "r", 0, store.CreateOptions{Raw: img}); err != nil {
		t.Fatal(err)
	}
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, store.BlockSize) }
	write := func(v store.Volume, lba uint64, b byte) {
		t.Helper()
		if err := v.WriteBlocks(ctx, lba, block(b), false); err != nil {
			t.Fatal(err)
		}
	}
	v1, err := s.OpenVolume(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s.OpenVolume(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	write(v1, 0, 0xa1)
	if err := s.Sync(ctx); err != nil {
		t.Fatalf("store sync: %v", err)
	}
	write(v1, 1, 0xb2)
	if err := v1.Close(); err != nil { // not the last handle
		t.Fatal(err)
	}
	if err := v2.Close(); err != nil { // the last: syncs block 1
		t.Fatal(err)
	}
	v3, err := s.OpenVolume(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	write(v3, 2, 0xc3) // never synced
	if err := fs.PowerCut(); err != nil {
		t.Fatal(err)
	}
	if err := v3.Close(); err == nil {
		t.Error("closing the last handle after the power cut reported no error (its sync cannot succeed)")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remount(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	for lba, want := range [][]byte{block(0xa1), block(0xb2), block(0)} {
		if b := got[lba*store.BlockSize : (lba+1)*store.BlockSize]; !bytes.Equal(b, want) {
			t.Errorf("block %d after the power cut holds %#x..., want %#x", lba, b[0], want[0])
		}
	}
}

// TestHealthOnDeadFileSystem: Health reports a file system the store can
// no longer write before any write or sync fails: the store's own, shut
// down as by a power cut (EIO) or made read-only by an error (EROFS), and
// a raw volume's.
func TestHealthOnDeadFileSystem(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		kill func(*loopfs.FS) error
		want error
	}{
		{"shutdown", (*loopfs.FS).PowerCut, syscall.EIO},
		{"read-only", (*loopfs.FS).ErrorReadOnly, syscall.EROFS},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := loopfs.Ext4FS(t, 256<<20)
			s := openThinOn(t, fs)
			v := createOpen(t, s, "v", 16<<20)
			if err := v.WriteBlocks(ctx, 0, make([]byte, 64<<10), true); err != nil {
				t.Fatal(err)
			}
			h := s.(store.HealthChecker)
			if err := h.Health(); err != nil {
				t.Fatalf("Health of a working store: %v", err)
			}
			if err := c.kill(fs); errors.Is(err, os.ErrNotExist) {
				t.Skipf("this kernel cannot raise an ext4 error: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			err := h.Health()
			if !errors.Is(err, c.want) {
				t.Fatalf("Health after the file system died: %v, want %v", err, c.want)
			}
			t.Logf("Health: %v", err)
			// A failed flush makes the close give up on badger at once
			// (TestCloseOnDeadFileSystem).
			if err := v.Flush(ctx); err == nil {
				t.Log("the flush succeeded: nothing was left to sync")
			}
			v.Close()
			s.Close()
		})
	}
	t.Run("raw", func(t *testing.T) {
		fs := loopfs.Ext4FS(t, 256<<20)
		s, err := store.OpenThin(t.TempDir(), store.ThinOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		v := createRaw(t, s, "r", filepath.Join(fs.Dir, "raw.img"))
		h := s.(store.HealthChecker)
		if err := h.Health(); err != nil {
			t.Fatalf("Health of a working store: %v", err)
		}
		if err := fs.PowerCut(); err != nil {
			t.Fatal(err)
		}
		if err := h.Health(); !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), `raw volume "r"`) {
			t.Fatalf("Health after the raw volume's file system died: %v, want EIO naming raw volume \"r\"", err)
		}
		v.Close()
		if err := h.Health(); err != nil {
			t.Errorf("Health once the raw volume is closed: %v, want nil (the store's own file system works)", err)
		}
	})
	t.Run("raw device read-only", func(t *testing.T) {
		loop := loopDevice(t, 16<<20)
		s, err := store.OpenThin(t.TempDir(), store.ThinOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.CreateVolume(ctx, "d", 0, store.CreateOptions{Raw: loop}); err != nil {
			t.Fatal(err)
		}
		v, err := s.OpenVolume(ctx, "d")
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		h := s.(store.HealthChecker)
		if err := h.Health(); err != nil {
			t.Fatalf("Health of a working device: %v", err)
		}
		if out, err := exec.Command("blockdev", "--setro", loop).CombinedOutput(); err != nil {
			t.Fatalf("blockdev --setro: %v\n%s", err, out)
		}
		err = h.Health()
		exec.Command("blockdev", "--setrw", loop).Run()
		if !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), `raw volume "d"`) {
			t.Fatalf("Health with the device read-only: %v, want EROFS naming raw volume \"d\"", err)
		}
		t.Logf("Health: %v", err)
		if err := h.Health(); err != nil {
			t.Errorf("Health with the device writable again: %v", err)
		}
		if err := v.WriteBlocks(ctx, 0, make([]byte, store.BlockSize), true); err != nil {
			t.Errorf("write with the device writable again: %v", err)
		}
	})
}

// loopDevice attaches a loop device over a new sparse file of size bytes
// for the test, and detaches it at the end; it skips the test without
// root or losetup and blockdev.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	loop, _ := loopDeviceImage(t, size)
	return loop
}

// loopDeviceImage is loopDevice that also returns the sparse file behind
// the device.
func loopDeviceImage(t *testing.T, size int64) (loop, img string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a loop device")
	}
	for _, tool := range []string{"losetup", "blockdev"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	img = filepath.Join(t.TempDir(), "dev.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("losetup: %v", err)
	}
	loop = strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	return loop, img
}

// TestFreedAtCloseSurvivesPowerCut: clusters freed by the commit that
// Close runs (a trim not flushed before) are free in the database, which
// Close then marks clean, so the next open does not punch the free ranges
// again. After a power cut right after Close, a new volume that gets those
// clusters and writes one block in each must read zeros elsewhere, never
// the trimmed volume's data.
func TestFreedAtCloseSurvivesPowerCut(t *testing.T) {
	fs := loopfs.Ext4FS(t, 256<<20)
	ctx := context.Background()
	s := openThinOn(t, fs)
	const size = 16 << 20
	a := createOpen(t, s, "a", size)
	fillVolume(t, a, 1)
	if err := a.Trim(ctx, 0, size/store.BlockSize); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.PowerCut(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remount(); err != nil {
		t.Fatal(err)
	}
	s = openThinOn(t, fs)
	defer s.Close()
	b := createOpen(t, s, "b", size)
	defer b.Close()
	cb := uint64(store.DefaultClusterSize / store.BlockSize)
	for c := uint64(0); c < size/store.DefaultClusterSize; c++ {
		lba := c*cb + 5
		if err := b.WriteBlocks(ctx, lba, storetest.Pattern(lba, 1, 2), false); err != nil {
			t.Fatal(err)
		}
	}
	checkOnly(t, b, 2, "volume made after the power cut")
}
