package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// thinVol is the in-memory state of a thin volume with open handles: its
// map and what decides copy on write. It lives while handles are open.
type thinVol struct {
	b    *thinBackend
	id   uint32
	name string
	m    *clusterMap
	// origin is the snapshot a clone reads what its own map lacks from;
	// nil for a volume that is not a clone. originMap caches what that
	// snapshot holds (a snapshot never changes): 0 unknown, else a cluster
	// entry or a hole.
	origin    *thinOrigin
	originMap *clusterMap
	size      atomic.Uint64 // blocks

	// ioLock is held shared by every I/O and exclusively while epoch or
	// latest change (snapshots).
	ioLock sync.RWMutex
	epoch  uint32 // entries made now are born in it
	latest uint32 // the newest snapshot's epoch, 0 if none

	locks clusterLocks

	handles int // open handles (thinBackend.volsMu)
}

// loadVol reads a volume's record and map; metaMu is held and the batch
// holds nothing of the volume (committed before).
func (b *thinBackend) loadVol(rec *thinRecord) (*thinVol, error) {
	v := &thinVol{b: b, id: rec.ID, name: rec.Name, m: newClusterMap(), origin: rec.Origin,
		epoch: rec.Epoch, latest: rec.latest()}
	v.size.Store(uint64(rec.Size) / BlockSize)
	if rec.Origin != nil {
		v.originMap = newClusterMap()
	}
	err := b.db.View(func(txn *badger.Txn) error {
		prefix := idKey(tkMap, rec.ID)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			e, err := itemEntry(item)
			if err != nil {
				return err
			}
			v.m.set(keyCluster(item.Key()), e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load map of %q: %w", rec.Name, err)
	}
	return v, nil
}

// clusters returns the clusters covering size bytes.
func (b *thinBackend) clusters(size int64) uint64 {
	return (uint64(size) + uint64(b.cs) - 1) / uint64(b.cs)
}

// shared reports whether the cluster of head entry e is referenced by
// something else too, so a write must copy it. ioLock is held.
func (v *thinVol) shared(e entry) bool {
	return e.counted() || e.birth() <= v.latest
}

// replace makes old's cluster c new: in the batch, and then in the map.
// When the latest snapshot sees old (it was born before the snapshot), old
// moves into the snapshot's delta; otherwise its cluster is released. The
// caller holds the cluster's lock and ioLock shared; fromFree tells where
// new's cluster came from (see alloc).
func (v *thinVol) replace(c uint64, old, new entry, fromFree bool) {
	op := batchOp{id: v.id, c: c, new: new, old: old}
	if v.latest > 0 && old.birth() <= v.latest {
		op.epoch = v.latest
	} else if p := old.phys(); p != 0 {
		if old.counted() {
			op.drop = p
		} else {
			op.free = p
		}
	}
	if fromFree {
		op.alloc = new.phys()
	}
	b := v.b
	b.batchMu.Lock()
	b.batch.ops = append(b.batch.ops, op)
	n := len(b.batch.ops)
	b.batchMu.Unlock()
	v.m.set(c, new)
	if n == batchKick {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// trimmed is the entry a discarded cluster gets: absent where nothing can
// show through and no snapshot needs to know when it changed, a hole
// otherwise.
func (v *thinVol) trimmed() entry {
	if v.origin == nil && v.latest == 0 {
		return 0
	}
	return holeEntry(v.epoch)
}

// afterChange commits the batch when it has grown past batchMax, which
// bounds its memory. Called without cluster locks.
func (v *thinVol) afterChange(ctx context.Context) error {
	if v.b.batchLen() < batchMax {
		return nil
	}
	return v.b.committer.Sync(ctx)
}

// numClusterLocks is the number of cluster lock stripes per volume.
const numClusterLocks = 256

// clusterLocks serialize the requests on one cluster: reads hold the
// clusters they touch shared, writes and discards exclusively, which makes
// each request atomic for concurrent ones and serializes the map changes
// of a cluster.
type clusterLocks [numClusterLocks]sync.RWMutex

// lockedClusters is a range of clusters locked by clusterLocks.lock: the
// stripes [lo, hi] and, when the range wraps around, [0, wrap].
type lockedClusters struct {
	l      *clusterLocks
	lo, hi uint64
	wrap   int
	excl   bool
}

// lock takes the stripes of clusters [first, last] in ascending order.
func (l *clusterLocks) lock(first, last uint64, excl bool) lockedClusters {
	r := lockedClusters{l: l, wrap: -1, excl: excl}
	if last-first+1 >= numClusterLocks {
		r.lo, r.hi = 0, numClusterLocks-1
	} else {
		r.lo, r.hi = first%numClusterLocks, last%numClusterLocks
		if r.hi < r.lo {
			r.wrap = int(r.hi)
			r.hi = numClusterLocks - 1
		}
	}
	for i := 0; i <= r.wrap; i++ {
		r.take(i)
	}
	for i := r.lo; i <= r.hi; i++ {
		r.take(int(i))
	}
	return r
}

func (r lockedClusters) take(i int) {
	if r.excl {
		r.l[i].Lock()
	} else {
		r.l[i].RLock()
	}
}

func (r lockedClusters) unlock() {
	for i := 0; i <= r.wrap; i++ {
		r.drop(i)
	}
	for i := r.lo; i <= r.hi; i++ {
		r.drop(int(i))
	}
}

func (r lockedClusters) drop(i int) {
	if r.excl {
		r.l[i].Unlock()
	} else {
		r.l[i].RUnlock()
	}
}
