package initiator_test

import (
	"bytes"
	"context"
	"testing"
)

// run is one run BlockStatus reported.
type run struct {
	n    int64
	hole bool
}

func runs(t *testing.T, blockStatus func(ctx context.Context, off, length int64, fn func(int64, bool) bool) error,
	off, length int64) []run {
	t.Helper()
	var out []run
	err := blockStatus(context.Background(), off, length, func(n int64, hole bool) bool {
		if k := len(out); k > 0 && out[k-1].hole == hole {
			out[k-1].n += n
		} else {
			out = append(out, run{n, hole})
		}
		return true
	})
	if err != nil {
		t.Fatalf("BlockStatus(%d, %d): %v", off, length, err)
	}
	var total int64
	for _, r := range out {
		total += r.n
	}
	if total != length {
		t.Fatalf("BlockStatus(%d, %d) covered %d bytes: %+v", off, length, total, out)
	}
	return out
}

// TestBlockStatus asks the target for the allocation of volumes of the
// memory and thin stores: holes where nothing was written or after a
// trim, data where it was written; unaligned ranges, ranges that need
// several EXTENTS, and an early stop.
func TestBlockStatus(t *testing.T) {
	for _, thin := range []bool{false, true} {
		name := "memory"
		if thin {
			name = "thin"
		}
		t.Run(name, func(t *testing.T) {
			const size = 256 << 20
			e := newEnv(t, envOpts{thin: thin, size: size})
			c := e.client("bs", nil)
			ctx := context.Background()
			if got := runs(t, c.BlockStatus, 0, size); len(got) != 1 || !got[0].hole {
				t.Fatalf("a new volume: %+v", got)
			}
			data := bytes.Repeat([]byte{7}, 1<<20)
			if err := c.WriteAt(ctx, data, 64<<20, false); err != nil {
				t.Fatal(err)
			}
			got := runs(t, c.BlockStatus, 0, size)
			if len(got) != 3 || !got[0].hole || got[1].hole || !got[2].hole || got[0].n > 64<<20 || got[1].n < 1<<20 {
				t.Fatalf("after a 1 MiB write at 64 MiB: %+v", got)
			}
			// Inside the written range, unaligned to blocks.
			if got := runs(t, c.BlockStatus, 64<<20+512, 8192); len(got) != 1 || got[0].hole {
				t.Fatalf("inside the write: %+v", got)
			}
			// Many small allocations: more extents than one EXTENTS holds.
			for i := int64(0); i < 300; i++ {
				if err := c.WriteAt(ctx, data[:4096], 128<<20+i*(256<<10), false); err != nil {
					t.Fatal(err)
				}
			}
			got = runs(t, c.BlockStatus, 128<<20, 300*(256<<10))
			if data := len(got) / 2; data < 300 {
				t.Fatalf("300 separate writes reported as %d runs", len(got))
			}
			calls := 0
			if err := c.BlockStatus(ctx, 0, size, func(int64, bool) bool { calls++; return calls < 2 }); err != nil || calls != 2 {
				t.Fatalf("stopping after 2 runs: %d calls, %v", calls, err)
			}
			if err := c.Trim(ctx, 64<<20, 1<<20); err != nil {
				t.Fatal(err)
			}
			if got := runs(t, c.BlockStatus, 60<<20, 8<<20); len(got) != 1 || !got[0].hole {
				t.Fatalf("after trimming the write: %+v", got)
			}
			if err := c.BlockStatus(ctx, size-4096, 8192, func(int64, bool) bool { return true }); err == nil {
				t.Fatal("BlockStatus past the end succeeded")
			}
		})
	}
}
