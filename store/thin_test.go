package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

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
// cover whole and partial clusters, and with the default size.
func TestThinModel(t *testing.T) {
	for _, cs := range []int64{16 << 10, store.DefaultClusterSize} {
		t.Run(strconv.FormatInt(cs>>10, 10)+"K", func(t *testing.T) {
			dir := t.TempDir()
			opts := store.ThinOptions{ClusterSize: cs}
			open := func(t *testing.T) store.Store {
				s, err := store.OpenThin(dir, opts)
				if err != nil {
					t.Fatal(err)
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
