package store

import (
	"context"
	"time"
)

// trimCheckBytes is how much block I/O passes between two checks of the
// mapped-file budget; trimCheckInterval bounds the time between checks.
const (
	trimCheckBytes    = 256 << 10
	trimCheckInterval = time.Second
)

// noteIO counts n bytes of block I/O and wakes the trimmer every
// trimCheckBytes.
func (b *badgerBackend) noteIO(n int) {
	if b.opts.MappedBudget < 0 {
		return
	}
	total := b.ioBytes.Add(int64(n))
	if total/trimCheckBytes != (total-int64(n))/trimCheckBytes {
		select {
		case b.trimKick <- struct{}{}:
		default:
		}
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
		rss, err := mappedFileRSS()
		if err != nil || rss <= b.opts.MappedBudget {
			continue
		}
		b.mapMu.Lock()
		_, err = pageOutValueLogs(b.dir)
		b.mapMu.Unlock()
		if err != nil {
			b.log.Warn("paging out value log mappings", "err", err)
		}
	}
}
