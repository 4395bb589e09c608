package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/initiator"
)

// model is the expected content of a volume.
type model struct {
	b []byte
}

// trim applies a TRIM to the model: whole blocks inside the range read as
// zeros, partial blocks keep their data.
func (m *model) trim(off, n int64) {
	first := (off + 4095) / 4096 * 4096
	end := (off + n) / 4096 * 4096
	if end > first {
		clear(m.b[first:end])
	}
}

// randomIO runs ops random operations on [base, base+span) of the volume
// through c (blocking calls, and batches of StartRead/StartWrite), checking every read against m (which this worker alone
// changes in that range).
func randomIO(ctx context.Context, c *initiator.Client, m *model, base, span int64, seed uint64, ops int) error {
	r := rand.New(rand.NewPCG(seed, seed*31))
	buf := make([]byte, 3<<20)
	for i := 0; i < ops; i++ {
		// Sizes: mostly small, some over the grant (two-step), some over
		// the maximum transfer (split).
		var n int64
		switch k := r.IntN(10); {
		case k < 6:
			n = int64(1+r.IntN(16)) * 512
		case k < 9:
			n = int64(1+r.IntN(256)) * 512
		default:
			n = int64(1+r.IntN(5000)) * 512
		}
		n = min(n, span)
		off := base + r.Int64N((span-n)/512+1)*512
		if r.IntN(3) == 0 { // block aligned, the common case
			off = base + (off-base)/4096*4096
			if off+n > base+span {
				off = base + span - n
			}
		}
		switch op := r.IntN(22); {
		case op >= 20:
			if err := asyncBatch(ctx, c, m, base, span, r); err != nil {
				return err
			}
		case op < 8:
			p := buf[:n]
			fill(p, r.Uint64())
			if err := c.WriteAt(ctx, p, off, r.IntN(4) == 0); err != nil {
				return fmt.Errorf("write %d at %d: %w", n, off, err)
			}
			copy(m.b[off:], p)
		case op < 16:
			p := buf[:n]
			if err := c.ReadAt(ctx, p, off); err != nil {
				return fmt.Errorf("read %d at %d: %w", n, off, err)
			}
			if !bytes.Equal(p, m.b[off:off+n]) {
				return fmt.Errorf("read %d at %d: data differs from the model", n, off)
			}
		case op < 17:
			if err := c.Trim(ctx, off, n); err != nil {
				return fmt.Errorf("trim %d at %d: %w", n, off, err)
			}
			m.trim(off, n)
		case op < 19:
			if err := c.WriteZeroes(ctx, off, n, r.IntN(2) == 0); err != nil {
				return fmt.Errorf("write-zeroes %d at %d: %w", n, off, err)
			}
			clear(m.b[off : off+n])
		default:
			if err := c.Flush(ctx); err != nil {
				return fmt.Errorf("flush: %w", err)
			}
		}
	}
	return nil
}

// asyncBatch starts up to 8 reads and writes on disjoint ranges with
// StartRead and StartWrite, plugged, then checks every outcome against m.
func asyncBatch(ctx context.Context, c *initiator.Client, m *model, base, span int64, r *rand.Rand) error {
	k := 1 + r.IntN(8)
	seg := span / int64(k) / 4096 * 4096
	if seg == 0 {
		k, seg = 1, span/512*512
	}
	type req struct {
		off   int64
		p     []byte
		write bool
		err   chan error
	}
	reqs := make([]req, k)
	unplug := c.Plug()
	for i := range reqs {
		// Sizes up to 256 KiB: some take the blocking path (larger than
		// a transfer, or no free slot).
		n := min(int64(1+r.IntN(64))*512*max(1, int64(r.IntN(8))), seg)
		off := base + int64(i)*seg + r.Int64N((seg-n)/512+1)*512
		q := req{off: off, p: make([]byte, n), write: r.IntN(2) == 0, err: make(chan error, 1)}
		done := func(err error) { q.err <- err }
		if q.write {
			fill(q.p, r.Uint64())
			c.StartWrite(ctx, q.p, q.off, r.IntN(4) == 0, initiator.CompletionFunc(done))
		} else {
			c.StartRead(ctx, q.p, q.off, initiator.CompletionFunc(done))
		}
		reqs[i] = q
	}
	unplug.Unplug()
	for _, q := range reqs {
		if err := <-q.err; err != nil {
			return fmt.Errorf("async write=%v %d at %d: %w", q.write, len(q.p), q.off, err)
		}
		if q.write {
			copy(m.b[q.off:], q.p)
		} else if !bytes.Equal(q.p, m.b[q.off:q.off+int64(len(q.p))]) {
			return fmt.Errorf("async read %d at %d: data differs from the model", len(q.p), q.off)
		}
	}
	return nil
}

// TestRandomIO: many goroutines over two clients do random reads, writes,
// trims, write-zeroes and flushes on their own parts of the volume; every
// read is checked against the model, and a third client reads the whole
// volume back at the end.
func TestRandomIO(t *testing.T) {
	for _, thin := range []bool{false, true} {
		name := "memory"
		if thin {
			name = "thin"
		}
		t.Run(name, func(t *testing.T) {
			const size = 32 << 20
			e := newEnv(t, envOpts{thin: thin, size: size})
			ctx := tctx(t)
			clients := []*initiator.Client{
				e.client("host-a", nil),
				e.client("host-b", func(c *initiator.Config) { c.QPs = 3; c.QueueDepth = 8 }),
			}
			m := &model{b: make([]byte, size)}
			const workers = 8
			ops := 150
			if testing.Short() {
				ops = 40
			}
			span := int64(size / workers)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := randomIO(ctx, clients[w%2], m, int64(w)*span, span, uint64(w+1), ops); err != nil {
						errs <- fmt.Errorf("worker %d: %w", w, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				return
			}
			c := e.client("host-c", nil)
			got := make([]byte, size)
			if err := c.ReadAt(ctx, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, m.b) {
				for i := range got {
					if got[i] != m.b[i] {
						t.Fatalf("final read differs from the model at byte %d", i)
					}
				}
			}
		})
	}
}
