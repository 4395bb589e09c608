package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rnic-dev/rnic/store"
)

// TagWriters are goroutines that write a volume's first blocks over and
// over, writer w the blocks lba = w (mod writers), each round with the next
// tag (FillBlock). Started[b] is the tag of the last write begun on block
// b, Acked[b] that of the last one acknowledged: a snapshot taken after
// Acked is read and before Started is read holds, per block, a tag between
// the two (CheckTags).
type TagWriters struct {
	Started, Acked []atomic.Uint64
	stop           chan struct{}
	wg             sync.WaitGroup
	errs           chan error
}

// StartTagWriters starts writers goroutines over the first n blocks of v.
func StartTagWriters(ctx context.Context, v store.Volume, n uint64, writers int) *TagWriters {
	tw := &TagWriters{Started: make([]atomic.Uint64, n), Acked: make([]atomic.Uint64, n),
		stop: make(chan struct{}), errs: make(chan error, writers)}
	for w := range writers {
		tw.wg.Add(1)
		go func() {
			defer tw.wg.Done()
			buf := make([]byte, bs)
			for tag := uint64(1); ; tag++ {
				for lba := uint64(w); lba < n; lba += uint64(writers) {
					select {
					case <-tw.stop:
						return
					default:
					}
					tw.Started[lba].Store(tag)
					FillBlock(buf, lba, tag)
					if err := v.WriteBlocks(ctx, lba, buf, false); err != nil {
						tw.errs <- fmt.Errorf("write of block %d, tag %d: %w", lba, tag, err)
						return
					}
					tw.Acked[lba].Store(tag)
				}
			}
		}()
	}
	return tw
}

// Stop stops the writers, waits for them and returns the first write
// error.
func (tw *TagWriters) Stop() error {
	close(tw.stop)
	tw.wg.Wait()
	close(tw.errs)
	return <-tw.errs // nil once closed and empty
}

// Load returns the tags in a, one by one.
func Load(a []atomic.Uint64) []uint64 {
	out := make([]uint64, len(a))
	for i := range a {
		out[i] = a[i].Load()
	}
	return out
}

// CheckTags checks that every block b of data is a pattern block of b
// (FillBlock) whose tag is within lo[b]..hi[b], an all-zero block being
// tag 0.
func CheckTags(data []byte, lo, hi []uint64) error {
	for b := range uint64(len(lo)) {
		tag, ok := BlockTag(data[b*bs:(b+1)*bs], b)
		if !ok || tag < lo[b] || tag > hi[b] {
			return fmt.Errorf("block %d: tag %d (a pattern block: %v), want %d..%d", b, tag, ok, lo[b], hi[b])
		}
	}
	return nil
}
