package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// thinBatch is the metadata changes of writes not yet committed: what the
// in-memory maps already show and the database does not, as a log of
// replacements in the order they were made. A commit makes the data files
// durable first, then writes the log in transactions that each hold whole
// replacements (a map entry, the delta entry keeping the old one or the
// release of its cluster, the allocation of the new one), so no map entry
// ever points at data that is not durable and no replacement is ever
// durable in part.
type thinBatch struct {
	ops []batchOp
}

// batchOp is one replacement of a map entry, or with id 0 the release of a
// cluster alone.
type batchOp struct {
	id    uint32
	epoch uint32 // old goes into this snapshot's delta; 0: none
	c     uint64
	new   entry
	old   entry
	free  uint64 // a cluster no longer referenced
	drop  uint64 // a counted cluster that lost one reference
	alloc uint64 // a cluster taken from the free ranges
}

// The bounds of a batch: past batchKick ops the committer is woken, past
// batchMax writers commit it themselves before going on.
const (
	batchKick = 16 << 10
	batchMax  = 4 * batchKick
)

func newThinBatch() *thinBatch { return &thinBatch{} }

// nextBatch returns an empty batch for the writers, on the memory of the
// last one committed (spare) when there is one: the batch's memory stays
// at its high mark instead of being allocated again for every commit.
func (b *thinBackend) nextBatch() *thinBatch {
	if b.spare != nil {
		bt := b.spare
		b.spare = nil
		return bt
	}
	return newThinBatch()
}

func (bt *thinBatch) empty() bool { return len(bt.ops) == 0 }

func (b *thinBackend) batchLen() int {
	b.batchMu.Lock()
	defer b.batchMu.Unlock()
	return len(b.batch.ops)
}

// commit is the function behind the sync group (Flush, FUA, Sync and the
// periodic commit share its runs, one at a time): data files first, then
// the batch.
//
// The data files are synced before metaMu is first taken. That sync
// writes back whatever the page cache holds of them, hundreds of
// megabytes after a burst of writes, and a catalog change (a snapshot, a
// volume created) need not wait for it: it commits its own transaction
// meanwhile, as it may while the batch still fills, or between the
// batch's transactions (commitChunk). The batch's replacements then reach
// the database after it, each naming the snapshot its old entry goes to,
// which is the order a snapshot taken before the swap gives too
// (createSnapshot).
func (b *thinBackend) commit() error {
	if err := b.checkFailed(); err != nil {
		return err
	}
	b.batchMu.Lock()
	bt := b.batch
	b.batch = b.nextBatch()
	b.batchMu.Unlock()
	defer func() {
		bt.ops = bt.ops[:0]
		b.batchMu.Lock()
		b.spare = bt
		b.batchMu.Unlock()
	}()
	if _, err := b.pool.sync(); err != nil {
		return b.fail(err)
	}
	if bt.empty() {
		b.syncs.Add(1)
		return nil
	}
	var freed []uint64
	for ops := bt.ops; len(ops) > 0; {
		b.metaMu.Lock()
		if err := b.checkFailed(); err != nil {
			b.metaMu.Unlock()
			return err // a catalog change failed meanwhile
		}
		n := min(len(ops), b.txnOps, b.commitChunk)
		b.pool.space.beforeMeta()
		err := b.syncBeforeTxn()
		var f []uint64
		if err == nil {
			f, err = b.commitOps(ops[:n])
			b.chunks.Add(1)
		}
		b.metaMu.Unlock()
		if err != nil {
			return b.fail(err)
		}
		freed = append(freed, f...)
		ops = ops[n:]
		if len(ops) > 0 {
			if h := b.chunkHook.Load(); h != nil {
				(*h)()
			}
			// Durable before the next transaction, this one's or a
			// catalog change's, is written (syncBeforeTxn).
			if err := b.syncNewestWAL(); err != nil {
				return b.fail(err)
			}
		}
	}
	// The sync needs no metaMu (it is no transaction, and a catalog
	// change syncs for itself), and under a file system busy writing back
	// the data it took up to 400 ms.
	if err := b.syncMeta(); err != nil {
		return b.fail(err)
	}
	b.syncs.Add(1)
	return b.release(freed)
}

// commitChunk (thinBackend.commitChunk) bounds the ops of one commit
// transaction, and so how long a catalog change (a snapshot) waits for
// metaMu behind a commit, which holds it for one transaction at a time.
// After rounds of copies on write a batch holds thousands of
// replacements, each a few microseconds of badger work: one transaction
// of 4096 kept a snapshot waiting 8.5 ms. Each transaction but the last
// is also made durable before the next (syncNewestWAL), a sync of the
// WAL per transaction: at 256 ops, 4 KiB random writes to a fresh volume
// through rinit lost 3-15 % (90 syncs a second), at 1024 nothing
// measurable. A catalog change committed between two transactions sees a
// prefix of the batch's log in the database, a state an earlier swap of
// the batch could have left there too: each transaction holds whole
// replacements, in order, their data already durable. The commit's
// durability (syncMeta) and the release of the clusters it freed follow
// the last transaction.
const commitChunk = 1024

// fail records a commit that failed: what the maps show in memory may not
// be what the database holds, so the store refuses further changes.
func (b *thinBackend) fail(err error) error {
	if p := b.failed.Load(); p != nil && errors.Is(err, *p) {
		return err // this failure, recorded already (syncMeta's)
	}
	err = fmt.Errorf("metadata commit: %w", err)
	b.failed.CompareAndSwap(nil, &err)
	b.log.Error("the store refuses changes until it is reopened", "err", err)
	return err
}

// commitOps writes ops in one transaction; metaMu is held. It returns the
// clusters they freed.
func (b *thinBackend) commitOps(ops []batchOp) ([]uint64, error) {
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	var freed []uint64
	for _, op := range ops {
		if op.id != 0 {
			var err error
			if op.new == 0 {
				err = txn.Delete(mapKey(op.id, op.c))
			} else {
				err = txn.Set(mapKey(op.id, op.c), putU64(uint64(op.new)))
			}
			if err != nil {
				return nil, err
			}
			if op.epoch != 0 {
				if err := txn.Set(deltaKey(op.id, op.epoch, op.c), putU64(uint64(op.old))); err != nil {
					return nil, err
				}
			}
		}
		if p := op.alloc; p != 0 {
			if !b.durable.contains(p) {
				return nil, fmt.Errorf("cluster %d allocated but not free: %w", p, ErrCorrupt)
			}
			b.durable.remove(p)
		}
		if p := op.free; p != 0 {
			freed = append(freed, p)
			b.durable.add(p, p+1)
		}
		if p := op.drop; p != 0 {
			gone, err := decref(txn, p)
			if err != nil {
				return nil, err
			}
			if gone {
				freed = append(freed, p)
				b.durable.add(p, p+1)
			}
		}
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
	return freed, txn.Commit()
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
	p, _, fromFree, err = b.allocRun(1)
	return p, fromFree, err
}

// allocRun hands out up to n free clusters that follow each other in one
// data file (at least one): from the first free range, else past the
// high-water mark.
func (b *thinBackend) allocRun(n uint64) (p, got uint64, fromFree bool, err error) {
	b.allocMu.Lock()
	defer b.allocMu.Unlock()
	if len(b.avail.r) > 0 {
		r := b.avail.r[0]
		got = min(n, r.end-r.start, b.fileRoom(r.start))
		for i := range got {
			b.avail.remove(r.start + i)
		}
		return r.start, got, true, nil
	}
	p = b.high
	got = min(n, b.fileRoom(p))
	if p+got > entryPhysMask {
		return 0, 0, false, fmt.Errorf("data files full (%d clusters): %w", b.high, ErrInvalid)
	}
	b.high = p + got
	return p, got, false, nil
}

// fileRoom returns how many clusters from p on lie in p's data file.
func (b *thinBackend) fileRoom(p uint64) uint64 {
	return (p>>b.pool.fileShift+1)<<b.pool.fileShift - p
}

// unalloc returns a cluster alloc handed out and nothing references. The
// write that failed may have left part of its data there: the cluster is
// made a hole again before it can be handed out, as release does.
func (b *thinBackend) unalloc(p uint64, fromFree bool) {
	if fromFree {
		if err := b.pool.punchClusters(p, p+1); err != nil {
			// Kept out of the allocator: free in the database, it is
			// punched by the next open, which a failed store makes an
			// unclean one.
			b.fail(err)
			return
		}
		b.allocMu.Lock()
		b.avail.add(p, p+1)
		b.allocMu.Unlock()
		return
	}
	// From past the high-water mark: free, but not in the database's free
	// ranges yet; the next commit puts it there and hands it out again.
	b.batchMu.Lock()
	b.batch.ops = append(b.batch.ops, batchOp{free: p})
	b.batchMu.Unlock()
}
