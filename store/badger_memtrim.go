package store

import (
	"context"
	"time"
)

// The mapped-file budget is checked whenever trimCheckBytes more value log
// memory may have been mapped, and at least every trimCheckInterval. A
// block written maps about its own 4 KiB; a block read can map 16 pages
// (the kernel maps cached neighbours of a faulting page too), so it counts
// readMapFactor times. Reads check on the spot, every readCheckBlocks
// blocks, so concurrent large reads cannot run far past the budget before
// the trimmer goroutine gets to run.
const (
	trimCheckBytes    = 4 << 20
	trimCheckInterval = time.Second
	readMapFactor     = 16
	readCheckBlocks   = 64
)

// noteWrite counts n bytes written and wakes the trimmer every
// trimCheckBytes.
func (b *badgerBackend) noteWrite(n int) {
	if b.opts.MappedBudget < 0 {
		return
	}
	if b.countMapped(n) {
		select {
		case b.trimKick <- struct{}{}:
		default:
		}
	}
}

// noteRead counts blocks read and checks the budget on the spot every
// trimCheckBytes (unless a check or value log GC is running already).
func (b *badgerBackend) noteRead(blocks int) {
	if b.opts.MappedBudget < 0 {
		return
	}
	if b.countMapped(blocks * BlockSize * readMapFactor) {
		if b.mapMu.TryLock() {
			b.trimIfOver()
			b.mapMu.Unlock()
		}
	}
}

// countMapped adds n bytes that may have been mapped and reports whether
// a multiple of trimCheckBytes was crossed.
func (b *badgerBackend) countMapped(n int) bool {
	total := b.ioBytes.Add(int64(n))
	return total/trimCheckBytes != (total-int64(n))/trimCheckBytes
}

// trimIfOver pages out the finished value logs if the process's
// file-backed RSS is over budget (b.mapMu held).
func (b *badgerBackend) trimIfOver() {
	rss, err := mappedFileRSS()
	if err != nil || rss <= b.opts.MappedBudget {
		return
	}
	if _, err := pageOutValueLogs(b.dir); err != nil {
		b.log.Warn("paging out value log mappings", "err", err)
	}
}

// trimMapped runs until ctx ends: whenever the process's file-backed RSS
// is over MappedBudget it pages out the value log mappings (see
// pageOutValueLogs). badger reads and writes its value log through mmap,
// so without this every block written or read stays in the RSS.
func (b *badgerBackend) trimMapped(ctx context.Context) {
	defer close(b.trimDone)
	if b.opts.MappedBudget < 0 {
		return
	}
	t := time.NewTicker(trimCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.trimKick:
		case <-t.C:
		}
		b.mapMu.Lock()
		b.trimIfOver()
		b.mapMu.Unlock()
	}
}
