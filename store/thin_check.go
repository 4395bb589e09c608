package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// check verifies the thin store's metadata against itself: every physical
// cluster below the high-water mark is either free or referenced, never
// both; reference counts match the references; the free ranges in memory
// match the database; and each volume's head and latest delta agree (a
// head entry is born after the latest snapshot exactly when that
// snapshot's delta has the cluster). It commits first.
func (b *thinBackend) check(ctx context.Context) error {
	if err := b.committer.Sync(ctx); err != nil {
		return err
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	return b.db.View(func(txn *badger.Txn) error {
		refs := map[uint64]int{}
		recs, err := b.records(txn)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			if rec.Version != thinRecordVersion {
				return fmt.Errorf("volume %q: record of version %d in a store of format %d", rec.Name, rec.Version, thinFormatVersion)
			}
			if rec.Rollback != nil {
				return fmt.Errorf("volume %q: rollback left unfinished", rec.Name)
			}
			if rec.Kind == KindRaw {
				continue
			}
			born := map[uint64]bool{}
			latest := rec.latest()
			err := scanEntries(ctx, txn, idKey(tkMap, rec.ID), func(c uint64, e entry) error {
				if p := e.phys(); p != 0 {
					refs[p]++
				}
				if e == 0 {
					return fmt.Errorf("volume %q cluster %d: zero entry stored", rec.Name, c)
				}
				if latest > 0 && e.birth() > latest {
					born[c] = true
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, s := range rec.Snapshots {
				if s.Deleting {
					return fmt.Errorf("volume %q: deletion of snapshot %q left unfinished", rec.Name, s.Name)
				}
				err := scanEntries(ctx, txn, deltaPrefix(rec.ID, s.Epoch), func(c uint64, e entry) error {
					if p := e.phys(); p != 0 {
						refs[p]++
					}
					if s.Epoch == latest && !born[c] {
						return fmt.Errorf("volume %q: snapshot %q has cluster %d, the head's entry is not newer", rec.Name, s.Name, c)
					}
					if s.Epoch == latest {
						delete(born, c)
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			for c := range born {
				return fmt.Errorf("volume %q: head cluster %d is newer than snapshot epoch %d, which lacks it", rec.Name, c, latest)
			}
		}
		// Deltas, maps and snapshots of volumes that are no more.
		live := map[uint32]bool{}
		for _, rec := range recs {
			if r, err := b.recordByID(txn, rec.ID); err != nil || r.Name != rec.Name {
				return fmt.Errorf("volume %q: its id %d finds another record: %v", rec.Name, rec.ID, err)
			}
			live[rec.ID] = true
		}
		for _, prefix := range []byte{tkMap, tkDelta, tkSnap} {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefix}})
			for it.Rewind(); it.Valid(); it.Next() {
				id := binary.BigEndian.Uint32(it.Item().Key()[1:5])
				if live[id] {
					continue
				}
				if _, err := b.recordByID(txn, id); err != nil {
					it.Close()
					return fmt.Errorf("key %x of volume %d: %w", it.Item().Key(), id, err)
				}
			}
			it.Close()
		}
		if it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkReap}}); true {
			it.Rewind()
			valid := it.Valid()
			it.Close()
			if valid {
				return errors.New("a deleted volume's data is still to be released")
			}
		}
		counted := map[uint64]uint32{}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkRef}, PrefetchValues: true})
		for it.Rewind(); it.Valid(); it.Next() {
			v, _ := it.Item().ValueCopy(nil)
			counted[keyCluster(it.Item().Key())] = binary.BigEndian.Uint32(v)
		}
		it.Close()
		for p, n := range refs {
			switch {
			case n == 1 && counted[p] != 0:
				return fmt.Errorf("cluster %d: 1 reference, count %d stored", p, counted[p])
			case n > 1 && counted[p] != uint32(n):
				return fmt.Errorf("cluster %d: %d references, count %d stored", p, n, counted[p])
			}
		}
		for p := range counted {
			if refs[p] == 0 {
				return fmt.Errorf("cluster %d: count stored, no reference", p)
			}
		}
		var stored rangeSet
		it = txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkFree}, PrefetchValues: true})
		for it.Rewind(); it.Valid(); it.Next() {
			v, _ := it.Item().ValueCopy(nil)
			stored.r = append(stored.r, clusterRange{keyCluster(it.Item().Key()), binary.BigEndian.Uint64(v)})
		}
		it.Close()
		if fmt.Sprint(stored.r) != fmt.Sprint(b.durable.r) {
			return fmt.Errorf("free ranges stored %v, in memory %v", stored.r, b.durable.r)
		}
		b.allocMu.Lock()
		high := b.high
		for _, r := range b.avail.r {
			for p := r.start; p < r.end; p++ {
				if !stored.contains(p) {
					b.allocMu.Unlock()
					return fmt.Errorf("cluster %d can be handed out but is not free", p)
				}
			}
		}
		b.allocMu.Unlock()
		for p := b.firstCluster(); p < high; p++ {
			free := stored.contains(p)
			switch {
			case free && refs[p] > 0:
				return fmt.Errorf("cluster %d is free and referenced %d times", p, refs[p])
			case !free && refs[p] == 0:
				return fmt.Errorf("cluster %d is neither free nor referenced (leaked)", p)
			}
		}
		for p := range refs {
			if p >= high {
				return fmt.Errorf("cluster %d referenced past the high-water mark %d", p, high)
			}
		}
		return nil
	})
}
