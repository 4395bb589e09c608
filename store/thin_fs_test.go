package store_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

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
