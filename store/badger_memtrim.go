package store

import (
	"context"
	"time"
)

// The mapped-file budget is checked whenever trimCheckBytes more value log
// memory may have been mapped, and at least every trimCheckInterval. A
// block written maps about its own 4 KiB. A block read can fault twice (a
// value may span two pages) and each fault maps up to 16 cached pages
// around it, so it counts readMapFactor times. Reads check on the spot,
// every readCheckBlocks blocks, and wait for a check under way (see trim),
// so concurrent large reads cannot run far past the budget.
const (
	trimCheckBytes    = 4 << 20
	trimCheckInterval = time.Second
	readMapFactor     = 64
	readCheckBlocks   = 16
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

// noteRead counts blocks read, readMapFactor times each, and checks the
// budget on the spot whenever that crosses a multiple of trimCheckBytes
// (every readCheckBlocks blocks), waiting for a check under way (trim).
func (b *badgerBackend) noteRead(blocks int) {
	if b.opts.MappedBudget < 0 {
		return
	}
	if b.countMapped(blocks * BlockSize * readMapFactor) {
		b.trim()
	}
}

// trim pages out the finished value logs if the process's file-backed RSS
// is over budget. Callers queue on checkMu: a trim takes milliseconds
// (madvise zaps hundreds of MiB of mappings) and readers that went on
// faulting pages meanwhile ran the RSS 50-90 MiB past the budget. The
// trim normally uses MADV_DONTNEED under mapMu. Value log GC holds mapMu
// for as long as it rewrites a file (seconds under load): then it evicts
// with MADV_PAGEOUT, which needs no lock.
func (b *badgerBackend) trim() {
	b.checkMu.Lock()
	defer b.checkMu.Unlock()
	if b.mapMu.TryLock() {
		b.trimIfOver(false)
		b.mapMu.Unlock()
		return
	}
	if b.inGC.Load() {
		b.trimIfOver(true)
	}
}

// countMapped adds n bytes that may have been mapped and reports whether
// a multiple of trimCheckBytes was crossed.
func (b *badgerBackend) countMapped(n int) bool {
	total := b.ioBytes.Add(int64(n))
	return total/trimCheckBytes != (total-int64(n))/trimCheckBytes
}

// trimIfOver pages out the finished value logs if the process's
// file-backed RSS is over budget (b.checkMu held, and b.mapMu unless evict).
func (b *badgerBackend) trimIfOver(evict bool) {
	rss, err := b.rss.fileRSS()
	if err != nil || rss <= b.opts.MappedBudget {
		return
	}
	if _, err := pageOutValueLogs(b.dir, evict); err != nil {
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
		b.trim()
	}
}
