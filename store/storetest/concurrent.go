package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// testRandomConcurrent runs 8 goroutines of random reads, writes, trims,
// write-zeroes and flushes on one volume and checks every read against an
// in-memory model. Each goroutine owns the 16-block stripes s with
// s%workers == its number, so its model of its stripes is exact; reads
// across the whole volume check that every block holds a block-sized,
// uncorrupted pattern written for that very lba (or zeros).
func testRandomConcurrent(t *testing.T, s *suite) {
	const (
		workers = 8
		stripe  = 16
		blocks  = 2048
	)
	ops := 600
	if testing.Short() {
		ops = 150
	}
	v := s.mustCreate("rand", blocks*bs)
	defer v.Close()
	ctx := context.Background()

	models := make([]map[uint64]uint64, workers) // lba -> tag, 0 for zeros
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		models[w] = make(map[uint64]uint64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := randomWorker(ctx, v, w, workers, stripe, blocks, ops, models[w]); err != nil {
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
	all := mustRead(t, v, 0, blocks)
	for lba := uint64(0); lba < blocks; lba++ {
		want := models[(lba/stripe)%workers][lba]
		got, ok := BlockTag(all[lba*bs:(lba+1)*bs], lba)
		if !ok || got != want {
			t.Fatalf("final block %d: tag %d (valid %v), model %d", lba, got, ok, want)
		}
	}
}

func randomWorker(ctx context.Context, v store.Volume, w, workers, stripe, blocks, ops int, model map[uint64]uint64) error {
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	seq := uint64(0)
	// ownRange picks a range of up to max blocks inside one of w's stripes.
	ownRange := func(max int) (uint64, int) {
		nstripes := blocks / stripe / workers
		s := uint64((rng.IntN(nstripes)*workers + w) * stripe)
		off := rng.IntN(stripe)
		n := 1 + rng.IntN(min(max, stripe-off))
		return s + uint64(off), n
	}
	for range ops {
		switch op := rng.IntN(100); {
		case op < 40: // write
			lba, n := ownRange(stripe)
			seq++
			tag := uint64(w+1)<<32 | seq
			if err := v.WriteBlocks(ctx, lba, Pattern(lba, n, tag), rng.IntN(10) == 0); err != nil {
				return err
			}
			for i := range uint64(n) {
				model[lba+i] = tag
			}
		case op < 50: // trim, write-zeroes or write-zeroes keeping the blocks allocated
			lba, n := ownRange(stripe)
			var err error
			switch {
			case op < 45:
				err = v.Trim(ctx, lba, uint64(n))
			case op < 47:
				err = v.WriteZeroes(ctx, lba, uint64(n), op == 46)
			default:
				err = v.WriteZeroesAllocated(ctx, lba, uint64(n), op == 49)
			}
			if err != nil {
				return err
			}
			for i := range uint64(n) {
				model[lba+i] = 0
			}
		case op < 75: // read own blocks: exact
			lba, n := ownRange(stripe)
			buf := make([]byte, n*bs)
			if err := v.ReadBlocks(ctx, lba, buf); err != nil {
				return err
			}
			for i := range uint64(n) {
				got, ok := BlockTag(buf[i*bs:(i+1)*bs], lba+i)
				if !ok || got != model[lba+i] {
					return fmt.Errorf("block %d: tag %d (valid %v), model %d", lba+i, got, ok, model[lba+i])
				}
			}
		case op < 98: // read anywhere: every block valid for its lba
			n := 1 + rng.IntN(64)
			lba := uint64(rng.IntN(blocks - n + 1))
			buf := make([]byte, n*bs)
			if err := v.ReadBlocks(ctx, lba, buf); err != nil {
				return err
			}
			for i := range uint64(n) {
				if _, ok := BlockTag(buf[i*bs:(i+1)*bs], lba+i); !ok {
					return fmt.Errorf("block %d holds data written for another block, or corrupt data", lba+i)
				}
			}
		default:
			if err := v.Flush(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// testAtomicWrites has writers overwrite overlapping ranges as wholes while
// readers check that each read sees, over the ranges every writer covers,
// the blocks of one single write.
func testAtomicWrites(t *testing.T, s *suite) {
	const blocks = 64
	// Writer i writes ranges[i%3]; all ranges cover [16, 48).
	ranges := [][2]uint64{{0, 64}, {0, 48}, {16, 48}}
	const common0, common1 = 16, 48
	writes := 80
	if testing.Short() {
		writes = 30
	}
	v := s.mustCreate("atomic", blocks*bs)
	defer v.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var writers, readers sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			r := ranges[w%len(ranges)]
			for i := range writes {
				tag := uint64(w+1)<<32 | uint64(i+1)
				if err := v.WriteBlocks(ctx, r[0], Pattern(r[0], int(r[1]-r[0]), tag), false); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	check := func(buf []byte, lba uint64) error {
		var first uint64
		for i := range uint64(len(buf) / bs) {
			tag, ok := BlockTag(buf[i*bs:(i+1)*bs], lba+i)
			if !ok {
				return fmt.Errorf("block %d is corrupt or misplaced", lba+i)
			}
			if lba+i < common0 || lba+i >= common1 {
				continue
			}
			if lba+i == max(lba, common0) {
				first = tag
			} else if tag != first {
				return fmt.Errorf("torn write: block %d has tag %x, block %d has %x", max(lba, common0), first, lba+i, tag)
			}
		}
		return nil
	}
	for r := range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for ctx.Err() == nil {
				n := 1 + rng.IntN(blocks)
				lba := uint64(rng.IntN(blocks - n + 1))
				buf := make([]byte, n*bs)
				// Every other read tries TryReadBlocks first: what it reads
				// must be as atomic as ReadBlocks.
				if r%2 == 0 || !v.TryReadBlocks(lba, buf) {
					if err := v.ReadBlocks(ctx, lba, buf); err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
				}
				if err := check(buf, lba); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	writers.Wait()
	cancel()
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := check(mustRead(t, v, 0, blocks), 0); err != nil {
		t.Errorf("final state: %v", err)
	}
}
