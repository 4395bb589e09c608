package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// viewEntry returns what snapshot epoch of volume id holds at cluster c, as
// committed: a cluster entry, or a hole (zeros). A snapshot's content is
// its own delta, then the deltas of the newer snapshots, then the head map;
// what none of them maps is its origin's for a clone, zeros otherwise. See
// doc.go (Snapshots).
func (b *thinBackend) viewEntry(id, epoch uint32, c uint64) (entry, error) {
	var out entry
	err := b.db.View(func(txn *badger.Txn) error {
		var err error
		out, err = b.viewIn(txn, id, epoch, c)
		return err
	})
	return out, err
}

func (b *thinBackend) viewIn(txn *badger.Txn, id, epoch uint32, c uint64) (entry, error) {
	for depth := 0; ; depth++ {
		if depth > 1<<16 {
			return 0, fmt.Errorf("clone chain of volume %d loops: %w", id, ErrCorrupt)
		}
		rec, err := b.recordByID(txn, id)
		if err != nil {
			return 0, err
		}
		e, found := entry(0), false
		for _, s := range rec.Snapshots {
			if s.Epoch < epoch {
				continue
			}
			if e, found, err = getEntry(txn, deltaKey(id, s.Epoch, c)); err != nil {
				return 0, err
			} else if found {
				break
			}
		}
		if !found {
			if e, _, err = getEntry(txn, mapKey(id, c)); err != nil {
				return 0, err
			}
		}
		switch {
		case e.phys() != 0:
			return mkEntry(e.phys(), 0), nil
		case e.hole() || rec.Origin == nil || c >= b.clusters(rec.Origin.Size):
			return holeEntry(0), nil
		}
		id, epoch = rec.Origin.ID, rec.Origin.Epoch
	}
}

// getEntry reads a map or delta entry.
func getEntry(txn *badger.Txn, key []byte) (entry, bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, err
	}
	var e uint64
	err = item.Value(func(v []byte) error {
		e, err = getU64("map entry", v)
		return err
	})
	return entry(e), true, err
}

// snapDevice is a read-only handle on a snapshot. What it resolves is
// cached: a snapshot never changes while a handle on it is open.
type snapDevice struct {
	b         *thinBackend
	id, epoch uint32
	n         uint64 // blocks
	cache     *clusterMap
}

func (b *thinBackend) openSnapshot(rec *thinRecord, s *thinSnap) *snapDevice {
	return &snapDevice{b: b, id: rec.ID, epoch: s.Epoch, n: uint64(s.Size) / BlockSize, cache: newClusterMap(b.clusters(s.Size))}
}

func (d *snapDevice) blocks() uint64 { return d.n }
func (d *snapDevice) release() error { return nil }

func (d *snapDevice) entry(c uint64) (entry, error) {
	if e := d.cache.get(c); e != 0 {
		return e, nil
	}
	e, err := d.b.viewEntry(d.id, d.epoch, c)
	if err == nil {
		d.cache.set(c, e)
	}
	return e, err
}

func (d *snapDevice) read(_ context.Context, lba uint64, dst []byte) error {
	b := d.b
	for len(dst) > 0 {
		c := lba / b.cb
		off := int64(lba%b.cb) * BlockSize
		n := int(min(int64(len(dst)), b.cs-off))
		e, err := d.entry(c)
		if err == nil && e.phys() != 0 {
			err = b.pool.readAt(dst[:n], e.phys(), off)
		} else if err == nil {
			clear(dst[:n])
		}
		if err != nil {
			clear(dst)
			return err
		}
		dst = dst[n:]
		lba += uint64(n / BlockSize)
	}
	return nil
}

func (d *snapDevice) write(context.Context, uint64, []byte, bool) error { return ErrReadOnly }
func (d *snapDevice) discard(context.Context, uint64, uint64, bool) error {
	return ErrReadOnly
}
func (d *snapDevice) flush(context.Context) error { return nil }

func (d *snapDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	r := extentRun{fn: fn}
	end := lba + count
	for lba < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(end-lba, d.b.cb-lba%d.b.cb)
		e, err := d.entry(lba / d.b.cb)
		if err != nil {
			return err
		}
		if !r.add(lba, n, e.phys() == 0) {
			return nil
		}
		lba += n
	}
	r.done()
	return nil
}
