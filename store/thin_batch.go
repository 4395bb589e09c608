package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// thinBatch is the metadata changes of writes not yet committed: what the
// in-memory maps already show and the database does not. A commit makes
// the data files durable first, then commits the whole batch in one
// transaction, so no map entry ever points at data that is not durable,
// and every replacement (map entry, the delta keeping the old entry, the
// freed cluster) becomes durable whole or not at all.
type thinBatch struct {
	maps   map[volCluster]entry // head entries to set (0: delete)
	deltas map[deltaCluster]entry
	frees  []uint64 // clusters no longer referenced
	decref []uint64 // clusters that lost one of possibly several references
	allocs []uint64 // clusters taken from the free ranges
	ops    int
}

type volCluster struct {
	id uint32
	c  uint64
}

type deltaCluster struct {
	id, epoch uint32
	c         uint64
}

func newThinBatch() *thinBatch {
	return &thinBatch{maps: make(map[volCluster]entry), deltas: make(map[deltaCluster]entry)}
}

func (bt *thinBatch) empty() bool { return bt.ops == 0 }

func (b *thinBackend) batchLen() int {
	b.batchMu.Lock()
	defer b.batchMu.Unlock()
	return b.batch.ops
}

// commit is the function behind the sync group (Flush, FUA, Sync and the
// periodic commit share its runs): data files first, then the batch.
func (b *thinBackend) commit() error {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if err := b.checkFailed(); err != nil {
		return err
	}
	b.batchMu.Lock()
	bt := b.batch
	b.batch = newThinBatch()
	b.batchMu.Unlock()
	if _, err := b.pool.sync(); err != nil {
		return b.fail(err)
	}
	if bt.empty() {
		b.syncs.Add(1)
		return nil
	}
	freed, err := b.commitBatch(bt)
	if err != nil {
		return b.fail(err)
	}
	b.syncs.Add(1)
	return b.release(freed)
}

// fail records a commit that failed: what the maps show in memory may not
// be what the database holds, so the store refuses further changes.
func (b *thinBackend) fail(err error) error {
	err = fmt.Errorf("metadata commit: %w", err)
	b.failed.CompareAndSwap(nil, &err)
	b.log.Error("the store refuses changes until it is reopened", "err", err)
	return err
}

// commitBatch writes bt in one transaction and syncs it; metaMu is held.
// It returns the clusters the batch freed.
func (b *thinBackend) commitBatch(bt *thinBatch) ([]uint64, error) {
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	for k, e := range bt.maps {
		var err error
		if e == 0 {
			err = txn.Delete(mapKey(k.id, k.c))
		} else {
			err = txn.Set(mapKey(k.id, k.c), putU64(uint64(e)))
		}
		if err != nil {
			return nil, err
		}
	}
	for k, e := range bt.deltas {
		if err := txn.Set(deltaKey(k.id, k.epoch, k.c), putU64(uint64(e))); err != nil {
			return nil, err
		}
	}
	for _, p := range bt.allocs {
		if !b.durable.contains(p) {
			return nil, fmt.Errorf("cluster %d allocated but not free: %w", p, ErrCorrupt)
		}
		b.durable.remove(p)
	}
	freed := append([]uint64(nil), bt.frees...)
	for _, p := range bt.decref {
		gone, err := decref(txn, p)
		if err != nil {
			return nil, err
		}
		if gone {
			freed = append(freed, p)
		}
	}
	for _, p := range freed {
		b.durable.add(p, p+1)
	}
	if err := b.putRanges(txn); err != nil {
		return nil, err
	}
	b.allocMu.Lock()
	high := b.high
	b.allocMu.Unlock()
	if err := txn.Set(thinHighKey, putU64(high)); err != nil {
		return nil, err
	}
	if err := txn.Commit(); err != nil {
		return nil, err
	}
	return freed, b.syncMeta()
}

// putRanges writes the free-range keys changed since the last call.
func (b *thinBackend) putRanges(txn *badger.Txn) error {
	for start, end := range b.durable.changes {
		var err error
		if end == 0 {
			err = txn.Delete(freeKey(start))
		} else {
			err = txn.Set(freeKey(start), putU64(end))
		}
		if err != nil {
			return err
		}
	}
	clear(b.durable.changes)
	return nil
}

// release makes committed free clusters holes and hands them out again.
func (b *thinBackend) release(freed []uint64) error {
	if len(freed) == 0 {
		return nil
	}
	var rs rangeSet
	for _, p := range freed {
		rs.add(p, p+1)
	}
	for _, r := range rs.r {
		if err := b.pool.punchClusters(r.start, r.end); err != nil {
			// The clusters stay free in the database; an unclean open
			// punches every free cluster, so they are never handed out
			// holding old data.
			return b.fail(err)
		}
	}
	b.allocMu.Lock()
	for _, r := range rs.r {
		b.avail.add(r.start, r.end)
	}
	b.allocMu.Unlock()
	return nil
}

// decref drops one reference to cluster p and reports whether it was the
// last.
func decref(txn *badger.Txn, p uint64) (bool, error) {
	item, err := txn.Get(refKey(p))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return true, nil
	} else if err != nil {
		return false, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return false, err
	}
	if len(v) != 4 || binary.BigEndian.Uint32(v) < 2 {
		return false, fmt.Errorf("reference count of cluster %d: %x: %w", p, v, ErrCorrupt)
	}
	n := binary.BigEndian.Uint32(v) - 1
	if n == 1 {
		return false, txn.Delete(refKey(p))
	}
	return false, txn.Set(refKey(p), binary.BigEndian.AppendUint32(nil, n))
}

// incref adds a reference to cluster p.
func incref(txn *badger.Txn, p uint64) error {
	n := uint32(2)
	item, err := txn.Get(refKey(p))
	switch {
	case err == nil:
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		if len(v) != 4 {
			return fmt.Errorf("reference count of cluster %d: %x: %w", p, v, ErrCorrupt)
		}
		n = binary.BigEndian.Uint32(v) + 1
	case !errors.Is(err, badger.ErrKeyNotFound):
		return err
	}
	return txn.Set(refKey(p), binary.BigEndian.AppendUint32(nil, n))
}

// alloc hands out a free cluster, the lowest one; fromFree reports whether
// it came from the free ranges (the batch must record that).
func (b *thinBackend) alloc() (p uint64, fromFree bool, err error) {
	b.allocMu.Lock()
	defer b.allocMu.Unlock()
	if p, ok := b.avail.first(); ok {
		b.avail.remove(p)
		return p, true, nil
	}
	if b.high >= entryPhysMask {
		return 0, false, fmt.Errorf("data files full (%d clusters): %w", b.high, ErrInvalid)
	}
	p = b.high
	b.high++
	return p, false, nil
}

// unalloc returns a cluster alloc handed out and nothing references.
func (b *thinBackend) unalloc(p uint64, fromFree bool) {
	if fromFree {
		b.allocMu.Lock()
		b.avail.add(p, p+1)
		b.allocMu.Unlock()
		return
	}
	// From past the high-water mark: free, but not in the database's free
	// ranges yet; the next commit puts it there and hands it out again.
	b.batchMu.Lock()
	b.batch.frees = append(b.batch.frees, p)
	b.batch.ops++
	b.batchMu.Unlock()
}
