package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// A snapshot's clusters are resolved on first read, one at a time, with a
// lookup in the delta of each snapshot from that one on, while no volume
// of its clone chain has viewSeekFrom such snapshots (the store's
// viewFrom). From there on a resolution covers the aligned window of
// viewWindow clusters around the one asked for, with one iterator seek per
// delta for the whole window and one for the head map: reading a snapshot
// with thousands of newer ones costs thousands of seeks per window instead
// of per cluster (BenchmarkSnapshotRead: 1 MiB reads of a snapshot with
// 2,000 newer ones about 35x faster, 4 KiB random reads of it about 18x).
// Below the bound the window is not used: random reads spread over a large
// volume, each in a window of its own, cost 1.3-2x more with it (a lookup
// and a seek cost about the same, and the window reads 64 entries for the
// one wanted).
const (
	viewSeekFrom = 8
	viewWindow   = 64
)

// viewEntries returns what snapshot epoch of volume id holds at cluster c,
// as committed: a cluster entry, or a hole (zeros). A snapshot's content is
// its own delta, then the deltas of the newer snapshots, then the head map;
// what none of them maps is its origin's for a clone, zeros otherwise (see
// doc.go, Snapshots). limit is the snapshot's size in clusters. When a
// volume of the clone chain has at least viewFrom snapshots a resolution
// may look into (manySnaps), or when wide (the caller will ask for the
// clusters that follow: a block status), it resolves the other clusters of
// c's window too; it passes every cluster it resolved, c included, to fill.
func (b *thinBackend) viewEntries(id, epoch uint32, c, limit uint64, wide bool, fill func(uint64, entry)) (entry, error) {
	var out entry
	err := b.db.View(func(txn *badger.Txn) error {
		rec, err := b.recordByID(txn, id)
		if err != nil {
			return err
		}
		c0, c1 := c, c+1
		many := wide
		if !many {
			if many, err = b.manySnaps(txn, rec, epoch); err != nil {
				return err
			}
		}
		if many {
			c0 = c &^ (viewWindow - 1)
			c1 = min(c0+viewWindow, limit)
		}
		res := make([]entry, c1-c0)
		if err := b.viewRange(txn, rec, epoch, c0, res); err != nil {
			return err
		}
		for i, e := range res {
			fill(c0+uint64(i), e)
		}
		out = res[c-c0]
		return nil
	})
	return out, err
}

// manySnaps reports whether a volume of the clone chain from snapshot
// epoch of the volume of rec has viewFrom or more snapshots a resolution
// may look into.
func (b *thinBackend) manySnaps(txn *badger.Txn, rec *thinRecord, epoch uint32) (bool, error) {
	for depth := 0; ; depth++ {
		if depth > 1<<16 {
			return false, fmt.Errorf("clone chain of volume %d loops: %w", rec.ID, ErrCorrupt)
		}
		if int64(newerSnaps(rec, epoch)) >= b.viewFrom.Load() {
			return true, nil
		}
		if rec.Origin == nil {
			return false, nil
		}
		epoch = rec.Origin.Epoch
		var err error
		if rec, err = b.recordByID(txn, rec.Origin.ID); err != nil {
			return false, err
		}
	}
}

// newerSnaps counts rec's snapshots from epoch on: the deltas a
// resolution of snapshot epoch may look into.
func newerSnaps(rec *thinRecord, epoch uint32) int {
	n := 0
	for _, s := range rec.Snapshots {
		if s.Epoch >= epoch {
			n++
		}
	}
	return n
}

// viewRange resolves clusters c0 .. c0+len(res)-1 of snapshot epoch of the
// volume of rec into res: for each, the first of the deltas from epoch on
// to hold the cluster, else the head map, else the origin's view, level by
// level down the clone chain.
func (b *thinBackend) viewRange(txn *badger.Txn, rec *thinRecord, epoch uint32, c0 uint64, res []entry) error {
	raw := make([]entry, len(res))
	found := make([]bool, len(res))
	left := len(res)
	for depth := 0; left > 0; depth++ {
		if depth > 1<<16 {
			return fmt.Errorf("clone chain of volume %d loops: %w", rec.ID, ErrCorrupt)
		}
		clear(raw)
		clear(found)
		if err := b.deltaRange(txn, rec, epoch, c0, res, raw, found); err != nil {
			return err
		}
		if err := b.mapRange(txn, rec.ID, c0, res, raw, found); err != nil {
			return err
		}
		for i, e := range raw {
			switch {
			case res[i] != 0:
			case e.phys() != 0:
				res[i], left = mkEntry(e.phys(), 0), left-1
			case e.hole() || rec.Origin == nil || c0+uint64(i) >= b.clusters(rec.Origin.Size):
				res[i], left = holeEntry(0), left-1
			}
		}
		if left == 0 {
			return nil
		}
		epoch = rec.Origin.Epoch
		var err error
		if rec, err = b.recordByID(txn, rec.Origin.ID); err != nil {
			return err
		}
	}
	return nil
}

// mapRange reads the head map entries of volume id for the clusters c0+i
// that res leaves unresolved and no delta holds (found) into raw: with a
// lookup for one cluster, with one seek for more.
func (b *thinBackend) mapRange(txn *badger.Txn, id uint32, c0 uint64, res, raw []entry, found []bool) error {
	if len(res) == 1 {
		if res[0] == 0 && !found[0] {
			e, _, err := getEntry(txn, mapKey(id, c0))
			raw[0] = e
			return err
		}
		return nil
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: idKey(tkMap, id)})
	defer it.Close()
	_, err := scanRange(it, mapKey(id, c0), c0, res, raw, found)
	return err
}

// scanRange reads, with one seek of it to from (the key of cluster c0 in a
// map or a delta), the entries of that map or delta for the clusters c0+i
// that res leaves unresolved and found unfound: into raw[i], with found[i]
// set. It returns how many it read.
func scanRange(it *badger.Iterator, from []byte, c0 uint64, res, raw []entry, found []bool) (int, error) {
	n, c1, prefix := 0, c0+uint64(len(res)), from[:len(from)-8]
	for it.Seek(from); it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		c := keyCluster(item.Key())
		if c >= c1 {
			break
		}
		i := c - c0
		if res[i] != 0 || found[i] {
			continue
		}
		e, err := itemEntry(item)
		if err != nil {
			return n, err
		}
		raw[i], found[i] = e, true
		n++
	}
	return n, nil
}

// deltaRange looks up, for each cluster c0+i that res leaves unresolved,
// the first delta from snapshot epoch on of the volume of rec that holds
// it: into raw[i], with found[i] set. For one cluster it looks it up in
// each delta (a lookup that finds nothing is cheap: badger's bloom
// filters); for a window it seeks once per delta to the window's first
// cluster and reads the entries up to its end, cheaper than a lookup per
// cluster of the window however few the deltas (BenchmarkBlockStatusView).
func (b *thinBackend) deltaRange(txn *badger.Txn, rec *thinRecord, epoch uint32, c0 uint64, res, raw []entry, found []bool) error {
	if len(res) == 1 {
		for i := range res {
			if res[i] != 0 {
				continue
			}
			for _, s := range rec.Snapshots {
				if s.Epoch < epoch {
					continue
				}
				e, ok, err := getEntry(txn, deltaKey(rec.ID, s.Epoch, c0+uint64(i)))
				if err != nil {
					return err
				}
				if ok {
					raw[i], found[i] = e, true
					break
				}
			}
		}
		return nil
	}
	unfound := 0
	for _, e := range res {
		if e == 0 {
			unfound++
		}
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: idKey(tkDelta, rec.ID)})
	defer it.Close()
	for _, s := range rec.Snapshots {
		if unfound == 0 {
			break
		}
		if s.Epoch < epoch {
			continue
		}
		n, err := scanRange(it, deltaKey(rec.ID, s.Epoch, c0), c0, res, raw, found)
		if err != nil {
			return err
		}
		unfound -= n
	}
	return nil
}

// getEntry reads a map or delta entry.
func getEntry(txn *badger.Txn, key []byte) (entry, bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, err
	}
	e, err := itemEntry(item)
	return e, true, err
}

// itemEntry decodes the map or delta entry item holds.
func itemEntry(item *badger.Item) (entry, error) {
	var e uint64
	err := item.Value(func(v []byte) error {
		var err error
		e, err = getU64("map entry", v)
		return err
	})
	return entry(e), err
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
	return &snapDevice{b: b, id: rec.ID, epoch: s.Epoch, n: uint64(s.Size) / BlockSize, cache: newClusterMap()}
}

func (d *snapDevice) blocks() uint64 { return d.n }
func (d *snapDevice) release() error { return nil }

// entry resolves cluster c, and with wide the rest of its window too (see
// viewEntries).
func (d *snapDevice) entry(c uint64, wide bool) (entry, error) {
	if e := d.cache.get(c); e != 0 {
		return e, nil
	}
	return d.b.viewEntries(d.id, d.epoch, c, d.b.clusters(int64(d.n)*BlockSize), wide, d.cache.set)
}

func (d *snapDevice) read(_ context.Context, lba uint64, dst []byte) error {
	b := d.b
	for len(dst) > 0 {
		c := lba / b.cb
		off := int64(lba%b.cb) * BlockSize
		n := int(min(int64(len(dst)), b.cs-off))
		e, err := d.entry(c, false)
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
		e, err := d.entry(lba/d.b.cb, true)
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
