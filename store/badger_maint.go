package store

import (
	"context"
	"errors"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// maintain is the store's background goroutine: it reaps the blocks of
// deleted volumes and runs value log GC every GCInterval, so trimmed and
// overwritten data frees disk space. It stops when ctx ends.
func (b *badgerBackend) maintain(ctx context.Context) {
	defer close(b.done)
	b.reapPending(ctx)
	var tick <-chan time.Time
	if b.opts.GCInterval > 0 {
		t := time.NewTicker(b.opts.GCInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.reapNow:
			b.reapPending(ctx)
		case <-tick:
			b.reapPending(ctx)
			b.runGC(ctx)
		}
	}
}

// runGC rewrites value log files while badger finds ones worth rewriting
// and returns how many it rewrote.
func (b *badgerBackend) runGC(ctx context.Context) int {
	n := 0
	for ctx.Err() == nil {
		b.mapMu.Lock() // GC deletes value log files: not while they are being paged out
		b.inGC.Store(true)
		err := b.db.RunValueLogGC(b.opts.GCDiscardRatio)
		b.inGC.Store(false)
		b.mapMu.Unlock()
		switch {
		case err == nil:
			n++
			continue
		case errors.Is(err, badger.ErrNoRewrite), errors.Is(err, badger.ErrRejected):
		default:
			b.log.Warn("value log GC", "err", err)
		}
		break
	}
	if n > 0 {
		b.log.Debug("value log GC", "rewritten", n)
	}
	return n
}
