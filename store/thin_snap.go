package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Snapshots, clones and rollback of the thin store. See doc.go (Snapshots)
// for the model these keep: per volume a head map and, per snapshot, a
// delta of the entries the head replaced after the snapshot was taken.

// quiesce stops the I/O of volume id if it is open, for a change of its
// epochs; with commit it also commits what the batch holds. The returned
// function resumes.
func (b *thinBackend) quiesce(ctx context.Context, id uint32, commit bool) (*thinVol, func(), error) {
	b.volsMu.Lock()
	v := b.vols[id]
	if v != nil {
		v.ioLock.Lock()
	}
	resume := func() {
		if v != nil {
			v.ioLock.Unlock()
		}
		b.volsMu.Unlock()
	}
	if commit {
		if err := b.committer.Sync(ctx); err != nil {
			resume()
			return nil, nil, err
		}
	}
	return v, resume, nil
}

// snapOf returns the record of volume name and its live snapshot snap.
func (b *thinBackend) snapOf(txn *badger.Txn, name, snap string) (*thinRecord, *thinSnap, error) {
	rec, err := b.getRecord(txn, name)
	if err != nil {
		return nil, nil, err
	}
	if rec.Kind == KindRaw {
		return nil, nil, fmt.Errorf("snapshots of a raw volume: %w", ErrNotSupported)
	}
	s, err := rec.snap(snap)
	return rec, s, err
}

// createSnapshot records the snapshot with the volume's I/O stopped for
// the time of one small transaction: the batch need not be committed
// first. Its changes go to the database after the record, in order, each
// naming the snapshot its old entry goes to, so every state the database
// goes through is consistent; a crash loses, in the snapshot as in the
// volume, only writes no Flush, FUA or Sync made durable.
func (b *thinBackend) createSnapshot(ctx context.Context, info VolumeInfo, name string) (SnapshotInfo, error) {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	v, resume, err := b.quiesce(ctx, info.ID, false)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer resume()
	var s thinSnap
	var rec *thinRecord
	err = b.grow(func(txn *badger.Txn) error {
		var err error
		if rec, err = b.getRecord(txn, info.Name); err != nil {
			return err
		}
		switch {
		case rec.Kind == KindRaw:
			return fmt.Errorf("snapshots of a raw volume: %w", ErrNotSupported)
		case rec.Epoch >= maxEpoch:
			return fmt.Errorf("volume took its %d snapshots: %w", maxEpoch, ErrNotSupported)
		}
		if _, err := rec.snap(name); err == nil {
			return fmt.Errorf("snapshot %q: %w", name, ErrExists)
		}
		s = thinSnap{Name: name, Epoch: rec.Epoch, Created: time.Now().UTC(), Size: rec.Size}
		rec.Snapshots = append(rec.Snapshots, s)
		rec.Epoch++
		return b.putRecord(txn, rec)
	})
	if err != nil {
		return SnapshotInfo{}, err
	}
	if v != nil {
		v.latest, v.epoch = s.Epoch, rec.Epoch
	}
	return SnapshotInfo{Name: s.Name, Created: s.Created, Size: s.Size}, nil
}

func (b *thinBackend) deleteSnapshot(ctx context.Context, info VolumeInfo, name string) error {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	// Changes in the batch may name the snapshot's delta: they go to the
	// database before its deletion begins.
	v, resume, err := b.quiesce(ctx, info.ID, true)
	if err != nil {
		return err
	}
	var epoch, latest uint32
	err = b.update(func(txn *badger.Txn) error {
		rec, err := b.getRecord(txn, info.Name)
		if err != nil {
			return err
		}
		s, err := rec.snap(name)
		if err != nil {
			return err
		}
		if err := b.dependents(txn, rec, s.Epoch); err != nil {
			return err
		}
		s.Deleting = true
		epoch, latest = s.Epoch, rec.latest()
		return b.putRecord(txn, rec)
	})
	if err == nil && v != nil {
		// Head entries born after the new latest snapshot are the head's
		// alone now; copies on write go to the new latest's delta.
		v.latest = latest
	}
	resume()
	if err != nil {
		return err
	}
	return b.finishSnapshotDelete(info.ID, epoch)
}

// finishSnapshotDelete empties the delta of snapshot epoch of volume id,
// being deleted, then drops the snapshot from the record. Each entry moves
// to the delta of the snapshot before it, which reads through it, unless
// that one has its own entry for the cluster (or there is none): then only
// the deleted snapshot referenced it and it is released.
func (b *thinBackend) finishSnapshotDelete(id, epoch uint32) error {
	for {
		done, err := b.snapshotDeleteStep(id, epoch)
		if err != nil {
			return fmt.Errorf("delete snapshot (volume %d, epoch %d): %w", id, epoch, err)
		}
		if done {
			return nil
		}
	}
}

func (b *thinBackend) snapshotDeleteStep(id, epoch uint32) (done bool, err error) {
	err = b.metaStep(func(txn *badger.Txn, drop func(p uint64) error) error {
		rec, err := b.recordByID(txn, id)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(rec.Snapshots, func(s thinSnap) bool { return s.Epoch == epoch })
		if i < 0 {
			done = true
			return nil
		}
		var pred *thinSnap
		if i > 0 {
			pred = &rec.Snapshots[i-1]
		}
		var keys [][]byte
		more := false
		err = scanEntries(context.Background(), txn, deltaPrefix(id, epoch), func(c uint64, e entry) error {
			if len(keys) == b.batchCap {
				more = true
				return errStopScan
			}
			if pred != nil {
				_, found, err := getEntry(txn, deltaKey(id, pred.Epoch, c))
				if err != nil {
					return err
				}
				if !found {
					return txn.Set(deltaKey(id, pred.Epoch, c), putU64(uint64(e)))
				}
			}
			return drop(e.phys())
		}, &keys)
		if err != nil && !errors.Is(err, errStopScan) {
			return err
		}
		if err := deleteKeys(txn, keys); err != nil {
			return err
		}
		if !more {
			rec.Snapshots = slices.Delete(rec.Snapshots, i, i+1)
			done = true
			return b.putRecord(txn, rec)
		}
		return nil
	})
	return done, err
}

func (b *thinBackend) clone(ctx context.Context, origin VolumeInfo, snap string, info VolumeInfo) (VolumeInfo, error) {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	// The clone reads its origin from the database: what the batch holds
	// from before the snapshot goes there first.
	if err := b.committer.Sync(ctx); err != nil {
		return VolumeInfo{}, err
	}
	var rec *thinRecord
	var out VolumeInfo
	err := b.grow(func(txn *badger.Txn) error {
		orec, s, err := b.snapOf(txn, origin.Name, snap)
		if err != nil {
			return err
		}
		id, err := b.newVolumeID(txn, info.Name)
		if err != nil {
			return err
		}
		rec = &thinRecord{Name: info.Name, ID: id, Kind: KindThin, Size: s.Size, Created: info.Created, Meta: info.Meta,
			Epoch: 1, Origin: &thinOrigin{ID: orec.ID, Epoch: s.Epoch, Size: s.Size}}
		if err := b.putRecord(txn, rec); err != nil {
			return err
		}
		out = rec.info()
		out.Origin = orec.Name + "@" + s.Name
		return nil
	})
	return out, err
}

func (b *thinBackend) rollback(ctx context.Context, info VolumeInfo, snap string) error {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	if err := b.committer.Sync(ctx); err != nil {
		return err
	}
	err := b.update(func(txn *badger.Txn) error {
		rec, s, err := b.snapOf(txn, info.Name, snap)
		if err != nil {
			return err
		}
		rec.Rollback = &thinRollback{Epoch: s.Epoch}
		return b.putRecord(txn, rec)
	})
	if err != nil {
		return err
	}
	return b.finishRollback(info.ID)
}

// finishRollback makes the head map of volume id what its snapshot holds,
// cluster by cluster, in transactions of bounded size; the record keeps
// the rollback and the next cluster, so a crash in between goes on at the
// next open. Only the clusters some delta from that snapshot on has an
// entry for differ from the head.
func (b *thinBackend) finishRollback(id uint32) error {
	for {
		done, err := b.rollbackStep(id)
		if err != nil {
			return fmt.Errorf("rollback (volume %d): %w", id, err)
		}
		if done {
			return nil
		}
	}
}

func (b *thinBackend) rollbackStep(id uint32) (done bool, err error) {
	err = b.metaStep(func(txn *badger.Txn, drop func(p uint64) error) error {
		rec, err := b.recordByID(txn, id)
		if err != nil {
			return err
		}
		rb := rec.Rollback
		if rb == nil {
			done = true
			return nil
		}
		target := rec.snapByEpoch(rb.Epoch)
		if target == nil {
			return fmt.Errorf("rollback to epoch %d: no such snapshot: %w", rb.Epoch, ErrCorrupt)
		}
		var deltas []uint32 // from the target on
		for _, s := range rec.Snapshots {
			if s.Epoch >= rb.Epoch {
				deltas = append(deltas, s.Epoch)
			}
		}
		latest := rec.latest()
		cs, more, err := b.deltaClusters(txn, id, deltas, rb.Next)
		if err != nil {
			return err
		}
		for _, c := range cs {
			var view entry
			for _, e := range deltas {
				var found bool
				if view, found, err = getEntry(txn, deltaKey(id, e, c)); err != nil {
					return err
				} else if found {
					break
				}
			}
			head, _, err := getEntry(txn, mapKey(id, c))
			if err != nil {
				return err
			}
			// The head's entry goes to the latest snapshot if it sees it,
			// else it is released.
			if latest > 0 && head.birth() <= latest {
				if err := txn.Set(deltaKey(id, latest, c), putU64(uint64(head))); err != nil {
					return err
				}
			} else if err := drop(head.phys()); err != nil {
				return err
			}
			// The snapshot's entry becomes the head's, with a reference of
			// its own.
			var now entry
			switch {
			case view.phys() != 0:
				if err := incref(txn, view.phys()); err != nil {
					return err
				}
				now = mkEntry(view.phys(), rec.Epoch) | entryCounted
			case view.hole():
				now = holeEntry(rec.Epoch)
			default:
				now = mkEntry(0, rec.Epoch)
			}
			if err := txn.Set(mapKey(id, c), putU64(uint64(now))); err != nil {
				return err
			}
		}
		if !more {
			rec.Rollback = nil
			rec.Size = target.Size
			done = true
		} else {
			rb.Next = cs[len(cs)-1] + 1
		}
		return b.putRecord(txn, rec)
	})
	return done, err
}

// deltaClusters returns the smallest clusters from next on that any of the
// deltas has an entry for, at most a quarter of a batch of them, sorted,
// and whether there are more.
func (b *thinBackend) deltaClusters(txn *badger.Txn, id uint32, epochs []uint32, next uint64) ([]uint64, bool, error) {
	limit := max(1, b.batchCap/4)
	set := map[uint64]bool{}
	more := false
	for _, e := range epochs {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: deltaPrefix(id, e)})
		n := 0
		for it.Seek(deltaKey(id, e, next)); it.Valid(); it.Next() {
			if n == limit {
				more = true
				break
			}
			set[keyCluster(it.Item().Key())] = true
			n++
		}
		it.Close()
	}
	out := make([]uint64, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more, nil
}

// resume finishes what a crash interrupted: rollbacks, snapshot deletions
// and the release of deleted volumes.
func (b *thinBackend) resume() error {
	var recs []*thinRecord
	var reap []uint32
	err := b.db.View(func(txn *badger.Txn) error {
		var err error
		if recs, err = b.records(txn); err != nil {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkReap}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != 5 {
				return fmt.Errorf("reap key %x: %w", k, ErrCorrupt)
			}
			reap = append(reap, uint32(k[1])<<24|uint32(k[2])<<16|uint32(k[3])<<8|uint32(k[4]))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, rec := range recs {
		for _, s := range rec.Snapshots {
			if s.Deleting {
				b.log.Info("finishing an interrupted snapshot deletion", "volume", rec.Name, "snapshot", s.Name)
				if err := b.finishSnapshotDelete(rec.ID, s.Epoch); err != nil {
					return err
				}
			}
		}
		if rec.Rollback != nil {
			b.log.Info("finishing an interrupted rollback", "volume", rec.Name)
			if err := b.finishRollback(rec.ID); err != nil {
				return err
			}
		}
	}
	for _, id := range reap {
		b.log.Info("releasing the data of a deleted volume", "id", id)
		if err := b.reap(id); err != nil {
			return err
		}
	}
	return nil
}
