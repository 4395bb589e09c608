package store_test

import (
	"path/filepath"
	"testing"

	"github.com/rnic-dev/rnic/internal/loopfs"
	"github.com/rnic-dev/rnic/store"
)

// TestThinOnXFS runs the thin store's model (16 KiB clusters, so that
// requests cover whole and partial clusters, with reopens and the
// invariant check) on XFS, where the data files are written without the
// 64 KiB bound ext4 needs, and checks that bound on each file system.
func TestThinOnXFS(t *testing.T) {
	for _, fs := range []struct {
		name  string
		mount func(testing.TB, int64) string
		chunk int64
	}{{"xfs", loopfs.XFS, 0}, {"ext4", loopfs.Ext4, 64 << 10}} {
		t.Run(fs.name, func(t *testing.T) {
			dir := filepath.Join(fs.mount(t, 512<<20), "store")
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
		})
	}
}
