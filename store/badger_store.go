package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// Limits on BadgerOptions.
const (
	// minMemTableSize keeps a transaction (15% of a memtable) large enough
	// for a MaxAtomicWrite of blocks.
	minMemTableSize    = 8 << 20
	minValueLogFile    = 1 << 20
	maxValueLogFile    = 1<<30 - 1
	blockEntryEstimate = blockKeyLen + 12 + 2 + 10 // badger's per-entry txn estimate for a value in the value log
	deleteEntryEstim   = blockKeyLen + 2 + 10      // and for a delete
)

// badgerBackend stores volumes in one badger database.
type badgerBackend struct {
	dir  string
	opts BadgerOptions
	log  *slog.Logger
	db   *badger.DB
	lock *dirLock

	syncer *syncGroup
	// syncs counts completed syncs of the database (for tests and benchmarks).
	syncs atomic.Int64

	createMu sync.Mutex // serializes volume creation (the id counter)

	txnBlocks  int // most blocks written in one transaction
	txnDeletes int // most keys deleted in one transaction

	stop    context.CancelFunc
	done    chan struct{} // closed when maintain returns
	reapNow chan struct{} // wakes maintain to reap deleted volumes

	ioBytes  atomic.Int64  // block bytes read and written
	trimKick chan struct{} // wakes trimMapped
	// mapMu is held while the value log mappings are paged out with
	// MADV_DONTNEED and while value log GC runs (pageOutValueLogs).
	mapMu sync.Mutex
	// checkMu serializes budget checks (see trim); inGC is set while
	// value log GC runs, when trims evict instead.
	checkMu  sync.Mutex
	inGC     atomic.Bool
	rss      *rssProbe     // the checks' reader of the RSS (checkMu)
	trimDone chan struct{} // closed when trimMapped returns
}

// OpenBadger opens (creating if needed) the store in directory dir. Only one
// Store, in any process, may have a directory open: a second fails with
// ErrLocked. Existing volumes are opened as they are.
func OpenBadger(dir string, opts BadgerOptions) (Store, error) {
	b, err := openBadgerBackend(dir, opts)
	if err != nil {
		return nil, err
	}
	return newVolumeStore(b), nil
}

func openBadgerBackend(dir string, opts BadgerOptions) (*badgerBackend, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	// The resolved path, as /proc/self/maps shows badger's files.
	if abs, err := filepath.Abs(dir); err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			dir = real
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	db, err := badger.Open(opts.badgerOptions(dir))
	if err != nil {
		lock.unlock()
		return nil, fmt.Errorf("store: open %s: badger: %w", dir, err)
	}
	b := &badgerBackend{
		dir:     dir,
		opts:    opts,
		log:     opts.Logger.With("component", "store", "dir", dir),
		db:      db,
		lock:    lock,
		done:    make(chan struct{}),
		reapNow: make(chan struct{}, 1),

		trimKick: make(chan struct{}, 1),
		trimDone: make(chan struct{}),
		rss:      newRSSProbe(),
	}
	b.syncer = newSyncGroup(b.syncAll)
	b.txnBlocks = txnLimit(db, blockEntryEstimate)
	b.txnDeletes = txnLimit(db, deleteEntryEstim)
	if err := b.checkFormat(); err != nil {
		b.rss.close()
		db.Close()
		lock.unlock()
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	go b.maintain(ctx)
	go b.trimMapped(ctx)
	return b, nil
}

// txnLimit returns how many entries of estimated size per fit in one
// badger transaction (it refuses count >= MaxBatchCount or size >=
// MaxBatchSize).
func txnLimit(db *badger.DB, per int64) int {
	n := min(db.MaxBatchCount()-2, (db.MaxBatchSize()-1)/per-1)
	return int(max(1, min(n, math.MaxInt32)))
}

// checkFormat writes the format marker into a new database and checks it in
// an existing one, so a directory holding some other badger database is
// refused rather than misread.
func (b *badgerBackend) checkFormat() error {
	err := b.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(formatKey)
		if err == nil {
			return item.Value(func(v []byte) error {
				if string(v) != formatMagic {
					return fmt.Errorf("format marker %q, want %q: %w", v, formatMagic, ErrCorrupt)
				}
				return nil
			})
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		if it.Rewind(); it.Valid() {
			return fmt.Errorf("database has keys but no format marker (key %x): %w", it.Item().Key(), ErrCorrupt)
		}
		return txn.Set(formatKey, []byte(formatMagic))
	})
	if err != nil {
		return err
	}
	return b.syncAll()
}

func (b *badgerBackend) sync(ctx context.Context) error {
	return b.syncer.Sync(ctx)
}

func (b *badgerBackend) close() error {
	b.stop()
	<-b.done
	<-b.trimDone
	b.checkMu.Lock()
	b.rss.close()
	b.checkMu.Unlock()
	errSync := b.syncAll()
	errClose := b.db.Close()
	errUnlock := b.lock.unlock()
	if err := errors.Join(errSync, errClose, errUnlock); err != nil {
		return fmt.Errorf("close %s: %w", b.dir, err)
	}
	return nil
}
