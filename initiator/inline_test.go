package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// TestInlineReads reads every size from 512 bytes to twice the inline
// limit, at aligned and unaligned offsets, from several goroutines mixed
// with large reads, and checks every byte against a reference, for each
// combination of what the initiator asks and the target offers: inline
// (DATA) and RDMA Read (READY, RELEASE) exchanges interleave on the same
// QPs and slots. The target's counter shows which path answered.
func TestInlineReads(t *testing.T) {
	for _, c := range []struct {
		name        string
		ask, offer  int  // initiator InlineRead, target MaxInline (0: defaults)
		legacy      bool // the target refuses FlagInline like targets before it
		wantInlined int  // the largest read expected inline (0: none)
	}{
		{name: "defaults", wantInlined: initiator.DefaultInlineRead},
		{name: "target offers less", offer: 4096, wantInlined: 4096},
		{name: "initiator asks less", ask: 2048, wantInlined: 2048},
		{name: "largest", ask: blockproto.MaxInline, offer: blockproto.MaxInline, wantInlined: blockproto.MaxInline},
		{name: "target offers none", offer: -1},
		{name: "initiator asks none", ask: -1},
		{name: "legacy target", legacy: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := new(target.Metrics)
			e := newEnv(t, envOpts{size: 16 << 20, tcfg: func(cfg *target.Config) {
				cfg.MaxInline, cfg.LegacyLogin, cfg.Metrics = c.offer, c.legacy, m
			}})
			cl := e.client("inline", func(cfg *initiator.Config) { cfg.InlineRead = c.ask; cfg.QPs = 2; cfg.QueueDepth = 4 })
			ctx := tctx(t)
			ref := make([]byte, 4<<20)
			fill(ref, 11)
			if err := cl.WriteAt(ctx, ref, 0, false); err != nil {
				t.Fatal(err)
			}
			inlinedBefore := m.InlineReads.Load()
			limit := max(c.wantInlined, initiator.DefaultInlineRead)
			var sizes []int
			for n := 512; n <= 2*limit+1024; n += 512 {
				sizes = append(sizes, n)
			}
			wantInline := 0
			for _, n := range sizes {
				if n <= c.wantInlined {
					wantInline += 4 // one per offset below
				}
			}
			offsets := []int64{0, 512, 4096 - 512, 3*4096 + 1536}
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			check := func(n int, off int64) error {
				got := make([]byte, n)
				if err := cl.ReadAt(ctx, got, off); err != nil {
					return fmt.Errorf("read %d at %d: %w", n, off, err)
				}
				if !bytes.Equal(got, ref[off:off+int64(n)]) {
					return fmt.Errorf("read %d at %d: data differs", n, off)
				}
				return nil
			}
			// Small reads of every size, one goroutine per offset.
			for g, off := range offsets {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i, n := range sizes {
						at := off + int64((g*len(sizes)+i)%64)*65536
						if err := check(n, at); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			// Large reads at the same time: RDMA Reads, some split over the
			// maximum transfer (1 MiB), whose tail pieces may go inline.
			large := []int{64 << 10, 1 << 20, 256<<10 + 512, 2<<20 + 4096, 12288, 3 << 20}
			for _, n := range large {
				for at := 0; at < n; at += 1 << 20 {
					if min(n-at, 1<<20) <= c.wantInlined {
						wantInline++
					}
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i, n := range large {
					if err := check(n, int64(i)*512*7); err != nil {
						errs <- err
						return
					}
				}
			}()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// Exactly the reads (and pieces) up to the limit went inline.
			if got := int(m.InlineReads.Load() - inlinedBefore); got != wantInline {
				t.Fatalf("%d reads answered inline, want %d", got, wantInline)
			}
		})
	}
}

// checksumStore fails reads of one block with ErrChecksum, as a store does
// when a block does not match its CRC.
type checksumStore struct {
	store.Store
	bad uint64
}

func (s *checksumStore) OpenVolume(ctx context.Context, name string) (store.Volume, error) {
	v, err := s.Store.OpenVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	return &checksumVolume{Volume: v, bad: s.bad}, nil
}

type checksumVolume struct {
	store.Volume
	bad uint64
}

func (v *checksumVolume) ReadBlocks(ctx context.Context, lba uint64, dst []byte) error {
	if lba <= v.bad && v.bad < lba+uint64(len(dst)/store.BlockSize) {
		clear(dst)
		return fmt.Errorf("block %d: %w", v.bad, store.ErrChecksum)
	}
	return v.Volume.ReadBlocks(ctx, lba, dst)
}

// TestInlineReadErrors: a READ answered inline that fails gets an error
// RESPONSE (no data), on the same slot as the good reads around it; the
// session stays usable.
func TestInlineReadErrors(t *testing.T) {
	m := new(target.Metrics)
	e := newEnv(t, envOpts{size: 16 << 20, tcfg: func(cfg *target.Config) {
		cfg.Store, cfg.Metrics = &checksumStore{Store: cfg.Store, bad: 5}, m
	}})
	cl := e.client("inline", func(cfg *initiator.Config) { cfg.QPs = 1; cfg.QueueDepth = 1 })
	ctx := tctx(t)
	ref := make([]byte, 64<<10)
	fill(ref, 3)
	if err := cl.WriteAt(ctx, ref, 0, true); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off  int64
		n    int
		fail bool
	}{
		{4 * 4096, 4096, false}, {5 * 4096, 4096, true}, {5*4096 + 512, 1024, true}, {4*4096 + 2048, 4096, true},
		{6 * 4096, 8192, false}, {0, 64 << 10, true}, {5 * 4096, 512, true}, {0, 4096, false},
	} {
		got := make([]byte, c.n)
		err := cl.ReadAt(ctx, got, c.off)
		if c.fail {
			var se *initiator.StatusError
			if !errors.As(err, &se) || se.Status != blockproto.StatusChecksum {
				t.Fatalf("read %d at %d: %v, want a checksum error", c.n, c.off, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, ref[c.off:c.off+int64(c.n)]) {
			t.Fatalf("read %d at %d: %v (or data differs)", c.n, c.off, err)
		}
	}
	if m.InlineReads.Load() != 3 || m.Errors[target.OpRead].Load() != 5 {
		t.Fatalf("%d inline reads, %d read errors; want 3 and 5", m.InlineReads.Load(), m.Errors[target.OpRead].Load())
	}
}
