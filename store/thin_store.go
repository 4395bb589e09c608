package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"
)

// The directory layout of a thin store: the metadata database and the data
// files, next to the lock file.
const (
	thinMetaDir = "meta"
	thinDataDir = "data"
	// ballastName is the ballast file in the data directory (thin_space.go).
	ballastName = "ballast"
)

// thinFormat is the format record of a thin store.
type thinFormat struct {
	Format      string `json:"format"`
	Version     int    `json:"version"`
	ClusterSize int64  `json:"cluster_size"`
	UUID        string `json:"uuid"`
}

const (
	thinFormatName = "rnic-store thin"
	// thinFormatVersion 2 keeps each snapshot under a key of its own; a
	// store of format 1 (snapshots inside the volume records) is migrated
	// when opened (migrateFormat1).
	thinFormatVersion = 2
	dataHeaderMagic   = "RNICTHIN"
)

// ErrV1Store: the directory holds a store of the earlier format, with one
// badger value per block. See doc.go (Migration).
var ErrV1Store = errors.New("directory holds a v1 store (one badger value per block)")

// thinBackend keeps volume data in the data files and everything else in a
// badger database. See doc.go.
type thinBackend struct {
	dir  string
	opts ThinOptions
	log  *slog.Logger
	db   *badger.DB
	lock *dirLock
	pool *dataPool
	cs   int64  // cluster size in bytes
	cb   uint64 // blocks per cluster

	// syncMetaMu serializes syncMeta; taken after metaMu, never before.
	syncMetaMu sync.Mutex
	// syncMetaHook, when set (by tests only), runs before syncMeta's
	// db.Sync, and fails the sync when it returns an error.
	syncMetaHook atomic.Pointer[func() error]
	// walSyncedHook, when set (by tests only), runs in syncMeta once
	// db.Sync has made the newest memtable's WAL durable.
	walSyncedHook atomic.Pointer[func()]
	// chunkHook, when set (by tests only), runs in a batch commit between
	// two of its transactions, metaMu free, before the first one's sync.
	chunkHook atomic.Pointer[func()]
	// metaMu serializes the transactions that change metadata: commits of
	// the write batch and catalog changes. Order: volsMu, then a volume's
	// ioLock, then metaMu.
	metaMu sync.Mutex
	// chunks counts the transactions of batch commits written (under
	// metaMu); walSynced is the count the last WAL sync began at: every
	// transaction up to it is durable. A metadata transaction is written
	// only once walSynced has caught up with chunks (syncBeforeTxn).
	chunks, walSynced atomic.Uint64
	// catalogMu serializes catalog operations (create, snapshot, clone,
	// rollback, delete, resize) against each other.
	catalogMu sync.Mutex

	volsMu sync.Mutex
	vols   map[uint32]*thinVol // volumes with open handles, by id
	raws   map[uint32]*rawDevice
	// rawFailed keeps the failure of a raw volume's fdatasync (see
	// rawDevice.failed) once no handle holds its rawDevice.
	rawFailed map[uint32]rawFailure
	// rawSyncHook, when set (by tests only), runs before a raw volume's
	// fdatasync, and fails it when it returns an error.
	rawSyncHook atomic.Pointer[func() error]

	allocMu sync.Mutex
	avail   rangeSet // free clusters that may be handed out
	durable rangeSet // the free ranges as committed (metaMu)
	high    uint64   // clusters ever handed out, the header included

	batchMu sync.Mutex
	batch   *thinBatch
	spare   *thinBatch    // the last batch committed, emptied, for the next
	kick    chan struct{} // wakes maintain to commit a batch grown past batchKick
	// txnOps is how many batch ops one transaction takes; batchCap bounds
	// the entries the catalog operations change in one transaction.
	txnOps, batchCap int
	// commitChunk is at most how many batch ops a commit writes per hold
	// of metaMu (the constant; tests lower it).
	commitChunk int
	// viewFrom is how many snapshots from the one read make a snapshot's
	// view resolve a window of clusters at a time (viewSeekFrom; tests
	// lower it).
	viewFrom atomic.Int64

	recs recordCache // decoded volume records (getRecord)

	committer *syncGroup
	syncs     atomic.Int64
	failed    atomic.Pointer[error] // a commit that failed: the store refuses changes

	bufs sync.Pool // cluster-sized buffers for copies

	stop context.CancelFunc
	done chan struct{}
	// wbDone is closed when the data pool's writeback loop has stopped.
	wbDone chan struct{}
}

// OpenThin opens (creating if needed) the thin store in directory dir: the
// default store. Only one Store, in any process, may have a directory
// open: a second fails with ErrLocked. A directory holding a v1 store is
// refused with ErrV1Store.
func OpenThin(dir string, opts ThinOptions) (Store, error) {
	b, err := openThinBackend(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	return newVolumeStore(b), nil
}

// IsV1Store reports whether dir holds a v1 store.
func IsV1Store(dir string) bool {
	_, errManifest := os.Stat(filepath.Join(dir, "MANIFEST"))
	_, errMeta := os.Stat(filepath.Join(dir, thinMetaDir))
	return errManifest == nil && errors.Is(errMeta, os.ErrNotExist)
}

func openThinBackend(dir string, opts ThinOptions) (*thinBackend, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if IsV1Store(dir) {
		return nil, fmt.Errorf("%w: run rtarget volume migrate --data %s (see rtarget volume migrate --help)", ErrV1Store, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, migrateDir)); err == nil {
		return nil, fmt.Errorf("%w: run rtarget volume migrate --data %s again to finish it", ErrMigrating, dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, thinMetaDir), filepath.Join(dir, thinDataDir)} {
		if err := mkdirAllDurable(d); err != nil {
			return nil, err
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	db, err := openBadger(opts.badgerOptions(filepath.Join(dir, thinMetaDir)), opts.Logger.With("component", "store", "dir", dir))
	if err != nil {
		lock.unlock()
		return nil, err
	}
	b := &thinBackend{
		dir:       dir,
		opts:      opts,
		log:       opts.Logger.With("component", "store", "dir", dir),
		db:        db,
		lock:      lock,
		vols:      make(map[uint32]*thinVol),
		raws:      make(map[uint32]*rawDevice),
		rawFailed: make(map[uint32]rawFailure),
		done:      make(chan struct{}),
		wbDone:    make(chan struct{}),
		kick:      make(chan struct{}, 1),
	}
	if err := b.start(); err != nil {
		errs := []error{err, db.Close(), lock.unlock()}
		if b.pool != nil {
			errs = append(errs, b.pool.close())
		}
		return nil, errors.Join(errs...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	go b.maintain(ctx)
	go func() {
		defer close(b.wbDone)
		b.pool.writeback(ctx)
	}()
	return b, nil
}

// start checks the format, recovers from an unclean shutdown and finishes
// the operations a crash interrupted.
func (b *thinBackend) start() error {
	f, err := b.checkFormat()
	if err != nil {
		return err
	}
	if f.Version == 1 {
		if err := b.migrateFormat1(f); err != nil {
			return err
		}
	}
	b.cs = f.ClusterSize
	b.cb = uint64(b.cs / BlockSize)
	b.pool = newDataPool(filepath.Join(b.dir, thinDataDir), b.cs, b.opts.dataFileBytes,
		newSpaceGuard(b.opts.Reserve, b.opts.MemTableSize*3/2, b.log, filepath.Join(b.dir, thinDataDir, ballastName),
			filepath.Join(b.dir, thinDataDir), filepath.Join(b.dir, thinMetaDir)))
	if _, err := b.pool.space.refresh(); err != nil {
		return err
	}
	if err := b.pool.space.keepBallast(); err != nil {
		b.log.Warn("free space", "err", err)
	}
	if err := b.checkDataHeader(f); err != nil {
		return err
	}
	b.txnLimits()
	b.batch = newThinBatch()
	b.committer = newSyncGroup(b.commit)
	b.bufs.New = func() any { buf := make([]byte, b.cs); return &buf }

	unclean := false
	var merged []uint64 // starts of stored free ranges merged into the one before
	b.durable.changes = nil
	err = b.db.View(func(txn *badger.Txn) error {
		if _, err := txn.Get(thinOpenKey); err == nil {
			unclean = true
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		item, err := txn.Get(thinHighKey)
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
			b.high = b.firstCluster()
		case err != nil:
			return err
		default:
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if b.high, err = getU64("high-water mark", v); err != nil {
				return err
			}
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkFree}, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			start := keyCluster(it.Item().Key())
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			end, err := getU64("free range", v)
			if err != nil {
				return err
			}
			// The ranges come in the order of their starts. A range that
			// begins before the end of the one before it, or in the
			// store's header, was not written by this store (rangeSet
			// keeps them disjoint): handed out, its clusters could hold
			// two volumes' data at once, or the header.
			from := b.firstCluster() // where this range may start
			n := len(b.durable.r)
			if n > 0 {
				from = b.durable.r[n-1].end
			}
			if start < from || end <= start || end > b.high {
				return fmt.Errorf("free range [%d, %d): it must start at %d or later and end by %d: %w",
					start, end, from, b.high, ErrCorrupt)
			}
			if n > 0 && start == from {
				// Touching the one before: every cluster is free once,
				// but rangeSet keeps ranges apart. Merged here, and
				// written merged below.
				b.durable.r[n-1].end = end
				merged = append(merged, start)
				continue
			}
			b.durable.r = append(b.durable.r, clusterRange{start, end})
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.durable.changes = make(map[uint64]uint64)
	if len(merged) > 0 {
		b.log.Warn("free ranges that touch were stored apart: merging them", "merged", len(merged))
		for _, start := range merged {
			b.durable.note(start, 0)
			r := b.durable.r[b.durable.find(start)] // the range start now lies inside
			b.durable.note(r.start, r.end)
		}
	}
	if unclean {
		if err := b.reclaimLeaked(); err != nil {
			return err
		}
	}
	b.avail.r = append([]clusterRange(nil), b.durable.r...)
	// Clusters past the high-water mark were written by allocations that
	// were never committed; free clusters may hold such writes too after a
	// crash: both go back to holes, so a new allocation reads zeros.
	if err := b.pool.truncate(b.high); err != nil {
		return err
	}
	if unclean {
		b.log.Warn("the store was not closed cleanly: clearing its free clusters", "free_ranges", len(b.durable.r))
		for _, r := range b.durable.r {
			if err := b.pool.punchClusters(r.start, r.end); err != nil {
				return err
			}
		}
	}
	if _, err := b.pool.sync(); err != nil {
		return err
	}
	err = b.db.Update(func(txn *badger.Txn) error {
		if err := b.putRanges(txn); err != nil { // the merged free ranges
			return err
		}
		return txn.Set(thinOpenKey, nil)
	})
	if err != nil {
		return err
	}
	if err := b.syncMeta(); err != nil {
		return err
	}
	return b.resume()
}

// reclaimLeaked, after a crash, frees the clusters below the high-water
// mark that neither a free range nor any map or delta entry holds. A commit
// records the high-water mark as it is when it writes, past the clusters
// that writes beside it took from there and whose map changes went to the
// next batch; a crash before that batch's commit leaves them unreferenced.
// They become free ranges (and so are punched with the others).
func (b *thinBackend) reclaimLeaked() error {
	first := b.firstCluster()
	if b.high <= first {
		return nil
	}
	began := time.Now()
	used := make([]uint64, (b.high-first+63)/64)
	mark := func(p uint64) {
		if p >= first && p < b.high {
			used[(p-first)/64] |= 1 << ((p - first) % 64)
		}
	}
	err := b.db.View(func(txn *badger.Txn) error {
		for _, prefix := range []byte{tkMap, tkDelta} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefix}, PrefetchValues: true})
			for it.Rewind(); it.Valid(); it.Next() {
				e, err := itemEntry(it.Item())
				if err != nil {
					it.Close()
					return err
				}
				mark(e.phys())
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("find leaked clusters: %w", err)
	}
	for _, r := range b.durable.r {
		for p := r.start; p < r.end; p++ {
			mark(p)
		}
	}
	var leaked rangeSet
	var clusters uint64
	for p := first; p < b.high; p++ {
		if used[(p-first)/64]&(1<<((p-first)%64)) == 0 {
			leaked.add(p, p+1)
			clusters++
		}
	}
	took := time.Since(began).Round(time.Millisecond)
	if clusters == 0 {
		b.log.Info("no cluster lost in the crash", "clusters_checked", b.high-first, "took", took)
		return nil
	}
	b.log.Warn("freeing clusters that writes lost in the crash had taken", "clusters", clusters, "ranges", len(leaked.r), "took", took)
	for rs := leaked.r; len(rs) > 0; {
		n := min(len(rs), max(1, b.txnOps/4))
		for _, r := range rs[:n] {
			b.durable.add(r.start, r.end)
		}
		if err := b.db.Update(b.putRanges); err != nil {
			return fmt.Errorf("free leaked clusters: %w", err)
		}
		rs = rs[n:]
	}
	return nil
}

// firstCluster is the first cluster ever handed out: the header takes
// cluster 0, and data starts at 2 MiB (room for a header that grows).
func (b *thinBackend) firstCluster() uint64 {
	return max(1, uint64(dataStart/b.cs))
}

// dataStart is the byte offset of the first cluster of data.
const dataStart = 2 << 20

// checkFormat writes the format record into a new database and checks it
// in an existing one.
func (b *thinBackend) checkFormat() (thinFormat, error) {
	var f thinFormat
	err := b.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(thinFormatKey)
		if err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := json.Unmarshal(v, &f); err != nil || f.Format != thinFormatName {
				return fmt.Errorf("format record %q: %w", v, ErrCorrupt)
			}
			if f.Version != thinFormatVersion && f.Version != 1 {
				return fmt.Errorf("format version %d, this rtarget reads %d: %w", f.Version, thinFormatVersion, ErrCorrupt)
			}
			if f.ClusterSize < minClusterSize || f.ClusterSize > maxClusterSize || f.ClusterSize&(f.ClusterSize-1) != 0 {
				return fmt.Errorf("format record cluster size %d: %w", f.ClusterSize, ErrCorrupt)
			}
			return nil
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		if it.Rewind(); it.Valid() {
			return fmt.Errorf("database has keys but no format record (key %x): %w", it.Item().Key(), ErrCorrupt)
		}
		var id [16]byte
		rand.Read(id[:])
		f = thinFormat{Format: thinFormatName, Version: thinFormatVersion, ClusterSize: b.opts.ClusterSize, UUID: hex.EncodeToString(id[:])}
		v, err := json.Marshal(f)
		if err != nil {
			return err
		}
		return txn.Set(thinFormatKey, v)
	})
	return f, err
}

// checkDataHeader writes the data header of a new store (cluster 0 of the
// first data file) and checks that an existing one belongs to this
// database.
func (b *thinBackend) checkDataHeader(f thinFormat) error {
	want := []byte(dataHeaderMagic + " " + f.UUID + "\n")
	got := make([]byte, len(want))
	if err := b.pool.readAt(got, 0, 0); err != nil {
		return err
	}
	switch {
	case bytes.Equal(got, want):
		return nil
	case !isZeros(got):
		return fmt.Errorf("data file header %q does not match the metadata (store %s): %w", got, f.UUID, ErrCorrupt)
	}
	var high []byte
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(thinHighKey)
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
			return nil
		case err != nil:
			return err
		}
		high, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		// Not knowing whether the metadata has data, the header is not
		// written: that would pair these data files with it for good.
		return fmt.Errorf("data file header missing; read the high-water mark: %w", err)
	}
	if high != nil {
		return fmt.Errorf("data file header missing but the metadata has data: %w", ErrCorrupt)
	}
	if err := b.pool.writeAt(want, 0, 0); err != nil {
		return err
	}
	_, err = b.pool.sync()
	return err
}

func isZeros(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// txnLimits sizes what goes in one transaction: a batch op is at most a
// map entry, a delta entry, a reference count and two free range keys.
func (b *thinBackend) txnLimits() {
	const perOp = 5
	n := min(b.db.MaxBatchCount()/perOp, (b.db.MaxBatchSize()/perOp)/48)
	b.txnOps = int(max(64, n/2))
	b.batchCap = b.txnOps
	b.commitChunk = commitChunk
	b.viewFrom.Store(viewSeekFrom)
}

// migrateFormat1 moves the snapshots of format 1's volume records to keys
// of their own, a volume at a time, then records format 2. Each volume's
// snapshot keys go in transactions of at most migrateChunk keys, then its
// record of version 2, which makes them visible, in one more; so a crash
// in between leaves the volume as it was, and the next open goes on (a
// record of version 1 does not read snapshot keys, and the last step
// deletes any it does not list).
func (b *thinBackend) migrateFormat1(f thinFormat) error {
	const migrateChunk = 1024
	var names []string
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkVolume}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			names = append(names, string(it.Item().Key()[1:]))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate format 1: %w", err)
	}
	for _, name := range names {
		var rec *thinRecord
		err := b.db.View(func(txn *badger.Txn) error {
			var err error
			rec, err = b.getRecord(txn, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate format 1: %w", err)
		}
		if rec.Version != thinRecordVersionV1 {
			continue
		}
		for chunk := range slices.Chunk(rec.Snapshots, migrateChunk) {
			err := b.db.Update(func(txn *badger.Txn) error {
				for i := range chunk {
					v, err := encodeSnap(&chunk[i])
					if err != nil {
						return err
					}
					if err := txn.Set(snapKey(rec.ID, chunk[i].Epoch), v); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("migrate format 1: volume %q: %w", name, err)
			}
		}
		err = b.db.Update(func(txn *badger.Txn) error {
			listed := map[uint32]bool{}
			for _, s := range rec.Snapshots {
				listed[s.Epoch] = true
			}
			var extra [][]byte
			prefix := idKey(tkSnap, rec.ID)
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			for it.Rewind(); it.Valid(); it.Next() {
				k := it.Item().KeyCopy(nil)
				if len(k) != len(prefix)+4 || !listed[binary.BigEndian.Uint32(k[len(prefix):])] {
					extra = append(extra, k)
				}
			}
			it.Close()
			if err := deleteKeys(txn, extra); err != nil {
				return err
			}
			rec.SnapTag = newSnapTag()
			v, err := encodeThinRecord(rec)
			if err != nil {
				return err
			}
			return txn.Set(thinVolumeKey(name), v)
		})
		b.recs.drop(name)
		if err != nil {
			return fmt.Errorf("migrate format 1: volume %q: %w", name, err)
		}
		b.log.Info("migrated to format 2: snapshots under keys of their own", "volume", name, "snapshots", len(rec.Snapshots))
	}
	f.Version = thinFormatVersion
	err = b.db.Update(func(txn *badger.Txn) error {
		v, err := json.Marshal(f)
		if err != nil {
			return err
		}
		return txn.Set(thinFormatKey, v)
	})
	if err == nil {
		err = b.syncMeta()
	}
	if err != nil {
		return fmt.Errorf("migrate format 1: %w", err)
	}
	return nil
}

// syncMeta makes the metadata database durable: the value log, the WALs
// of full memtables and the directory are synced by hand, oldest WAL
// first (see syncBadgerDir), then db.Sync covers the WAL of the mutable
// memtable (and the value log again). The syncs run one at a time, and
// the first that fails fails the store (fail): the kernel reports a
// write-back error to an open file once, so a sync beside or after the
// failed one could succeed with the metadata lost.
func (b *thinBackend) syncMeta() error {
	b.syncMetaMu.Lock()
	defer b.syncMetaMu.Unlock()
	if err := b.checkFailed(); err != nil {
		return err
	}
	var err error
	if h := b.syncMetaHook.Load(); h != nil {
		err = (*h)()
	}
	if err != nil {
		err = fmt.Errorf("badger sync: %w", err)
	} else {
		err = b.syncWALsLocked()
	}
	if h := b.walSyncedHook.Load(); h != nil && err == nil {
		(*h)()
	}
	if err != nil {
		return b.fail(err)
	}
	return nil
}

// syncWALsLocked makes every transaction written so far durable;
// syncMetaMu is held. The WALs of full memtables go before db.Sync's of
// the newest one, so a later transaction is never durable before an
// earlier one (see syncBadgerDir).
func (b *thinBackend) syncWALsLocked() error {
	upTo := b.chunks.Load()
	if err := syncBadgerDir(filepath.Join(b.dir, thinMetaDir)); err != nil {
		return err
	}
	if err := b.db.Sync(); err != nil {
		return fmt.Errorf("badger sync: %w", err)
	}
	b.walSynced.Store(upTo) // syncs run one at a time, and chunks only grows
	return nil
}

// syncNewestWAL makes the transactions of batch commits written so far
// durable, when no sync since has: db.Sync, which syncs the newest WAL
// only, is enough, since every transaction written before the newest WAL
// began was durable by then (syncBeforeTxn and the sync after each commit
// transaction keep that so, and syncMeta syncs every WAL).
func (b *thinBackend) syncNewestWAL() error {
	b.syncMetaMu.Lock()
	defer b.syncMetaMu.Unlock()
	upTo := b.chunks.Load()
	if b.walSynced.Load() >= upTo {
		return nil
	}
	if err := b.db.Sync(); err != nil {
		return fmt.Errorf("badger sync: %w", err)
	}
	b.walSynced.Store(upTo)
	return nil
}

// syncBeforeTxn makes the transactions of batch commits written so far
// durable, if no sync has since; metaMu is held, and a metadata
// transaction follows. Badger's WALs are mapped files the kernel writes
// back in any order: were the next transaction to start a new WAL, it
// could reach the disk before the one before it, and a power failure keep
// a state that no sequence of whole transactions gives (a catalog change
// computed over a commit's transaction that was lost, or the commit's
// next transaction without its last: TestWALWritebackPowerCut). A batch
// commit syncs after each of its transactions, outside metaMu: there is
// mostly nothing left to wait for here.
func (b *thinBackend) syncBeforeTxn() error {
	if b.walSynced.Load() >= b.chunks.Load() {
		return nil
	}
	return b.syncNewestWAL()
}

// maintain commits the write batch every CommitInterval.
func (b *thinBackend) maintain(ctx context.Context) {
	defer close(b.done)
	t := time.NewTicker(b.opts.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Other writers of the file system, and space given back.
			if _, err := b.pool.space.refresh(); err != nil {
				b.log.Warn("free space", "err", err)
			} else if err := b.pool.space.keepBallast(); err != nil {
				b.log.Warn("free space", "err", err)
			}
		case <-b.kick:
		}
		if b.batchLen() > 0 {
			if err := b.committer.Sync(ctx); err != nil && ctx.Err() == nil {
				b.log.Error("periodic commit", "err", err)
			}
		}
	}
}

// Syncs implements Syncer: the commits done so far.
func (b *thinBackend) Syncs() uint64 { return uint64(b.syncs.Load()) }

// sync makes what the thin volumes and the open raw volumes were written
// durable (a raw volume no handle holds was synced when the last went).
func (b *thinBackend) sync(ctx context.Context) error {
	err := b.committer.Sync(ctx)
	b.volsMu.Lock()
	raws := make([]*rawDevice, 0, len(b.raws))
	for _, d := range b.raws {
		d.handles++ // kept open while it syncs
		raws = append(raws, d)
	}
	b.volsMu.Unlock()
	for _, d := range raws {
		if d.unsynced() || d.failed.Load() != nil {
			if ferr := d.flush(ctx); ferr != nil {
				err = errors.Join(err, fmt.Errorf("raw volume %q: %w", d.name, ferr))
			}
		}
		if rerr := d.release(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("raw volume %q: %w", d.name, rerr))
		}
	}
	return err
}

func (b *thinBackend) close() error {
	b.stop()
	<-b.done
	<-b.wbDone
	errCommit := b.committer.Sync(context.Background())
	if errCommit == nil {
		// The last commit punched the clusters it freed after its data
		// sync; a clean open does not punch free ranges again, so those
		// holes must be durable before the store is marked clean.
		_, errCommit = b.pool.sync()
	}
	var errMark error
	if errCommit == nil && b.failed.Load() == nil {
		errMark = b.db.Update(func(txn *badger.Txn) error { return txn.Delete(thinOpenKey) })
		if errMark == nil {
			errMark = b.syncMeta()
		}
	}
	errPool := b.pool.close()
	errDB := b.closeDB(errCommit != nil || errMark != nil || b.failed.Load() != nil)
	errLock := b.lock.unlock()
	if err := errors.Join(errCommit, errMark, errPool, errDB, errLock); err != nil {
		return fmt.Errorf("close %s: %w", b.dir, err)
	}
	return nil
}

// closeDB closes the metadata database. badger's Close writes its memtable
// out as a table, and retries that forever, once a second, when it fails:
// on a file system that died (EIO) it never returns. So closeDB waits at
// most closeDBWait for it (closeDBFailWait when failed: a sync or commit
// of the store failed, so that it most likely cannot), then returns an
// error and leaves the database as a crash would: its files stay locked
// until the process exits, and the next open replays its log.
func (b *thinBackend) closeDB(failed bool) error {
	done := make(chan error, 1)
	go func() { done <- b.db.Close() }()
	wait := closeDBWait
	if failed {
		wait = closeDBFailWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("the metadata database did not close within %s (left as after a crash: the next open recovers it)", wait)
	}
}

// How long closeDB waits for badger: a close that writes out a full
// memtable (64 MiB) on a slow disk takes seconds.
const (
	closeDBWait     = 30 * time.Second
	closeDBFailWait = 2 * time.Second
)

// Health implements HealthChecker: the store's failure (checkFailed), or
// those of its raw volumes.
//
// It also asks the file systems, at no I/O: the store's (through its first
// data file and badger's manifest) and each open raw volume's file, or its
// device (probeDevice). A file system shut down (XFS after a metadata
// write error; ext4 or XFS by FS_IOC_SHUTDOWN) refuses to open a file,
// with EIO, and one made read-only after an error (ext4 mounted
// errors=remount-ro) refuses to open one for writing, with EROFS: either
// way the store can no longer write, which without the probe only the
// next flush or commit would tell.
func (b *thinBackend) Health() error {
	if err := b.checkFailed(); err != nil {
		return err
	}
	var errs []error
	for _, path := range []string{b.pool.path(0), filepath.Join(b.dir, thinMetaDir, badgerManifest)} {
		if err := probeFile(path); err != nil {
			errs = append(errs, err)
		}
	}
	b.volsMu.Lock()
	defer b.volsMu.Unlock()
	for id, f := range b.rawFailed {
		if b.raws[id] == nil {
			errs = append(errs, fmt.Errorf("raw volume %q: %w", f.name, *f.err))
		}
	}
	for _, d := range b.raws {
		err := d.checkFailed()
		switch {
		case err != nil:
		case d.device:
			err = probeDevice(d.fd)
		default:
			// Opened anew through the descriptor: the file, wherever it
			// was renamed to.
			err = probeFile(fmt.Sprintf("/proc/self/fd/%d", d.fd))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("raw volume %q: %w", d.name, err))
		}
	}
	return errors.Join(errs...)
}

// badgerManifest is the file badger keeps its table list in, for as long
// as the database exists.
const badgerManifest = "MANIFEST"

// probeFile opens the file at path for writing, and closes it: the health
// probe of a file system, which costs no disk I/O. A refusal for want of
// permission is no failure: the file's mode or owner changed since the
// store opened it, which its open descriptors do not care about.
func probeFile(path string) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("file system check: open %s: %w", path, err)
	}
	unix.Close(fd)
	return nil
}

// probeDevice is probeFile for a raw volume's block device, asked on its
// open descriptor (BLKROGET): a device made read-only (blockdev --setro, a
// write-protect switch, a dm table loaded read-only) fails every write
// with EPERM. It is not opened anew as a file is: closing a disk opened
// for writing makes udev, which watches disks, send a change event and
// re-read the partition table, on every probe.
func probeDevice(fd int) error {
	ro, err := unix.IoctlGetInt(fd, unix.BLKROGET)
	if err != nil {
		return fmt.Errorf("device check: %w", err)
	}
	if ro != 0 {
		return fmt.Errorf("device check: the device is read-only: %w", unix.EROFS)
	}
	return nil
}

// checkFailed returns the error of a failed commit, after which the store
// refuses changes.
func (b *thinBackend) checkFailed() error {
	if p := b.failed.Load(); p != nil {
		return fmt.Errorf("an earlier metadata commit failed, the store refuses changes until reopened: %w", *p)
	}
	return nil
}
