package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"

	"github.com/dgraph-io/badger/v4"
)

// Volume records of the thin store: create, look up, list, delete, resize.

// getRecord returns the record of volume name with its snapshots. It
// iterates when the record is not cached: not inside another iteration of
// txn when txn writes (badger allows one iterator at a time there).
func (b *thinBackend) getRecord(txn *badger.Txn, name string) (*thinRecord, error) {
	return b.lookupRecord(txn, name, true)
}

// lookupRecord is getRecord; without own, the record may be the cache's,
// which the caller must not change.
func (b *thinBackend) lookupRecord(txn *badger.Txn, name string, own bool) (*thinRecord, error) {
	item, err := txn.Get(thinVolumeKey(name))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, err
	}
	var rec *thinRecord
	var raw []byte
	err = item.Value(func(v []byte) error {
		if rec = b.recs.get(name, v, own); rec != nil {
			return nil
		}
		raw = bytes.Clone(v)
		rec, err = decodeThinRecord(name, v)
		return err
	})
	if err != nil || raw == nil {
		return rec, err
	}
	if err := b.loadSnaps(txn, rec); err != nil {
		return nil, err
	}
	b.recs.put(name, raw, rec)
	return rec, nil
}

// loadSnaps reads the snapshots of a record of version 2 from their keys.
func (b *thinBackend) loadSnaps(txn *badger.Txn, rec *thinRecord) error {
	if rec.Version == thinRecordVersionV1 {
		return nil // in the record
	}
	prefix := idKey(tkSnap, rec.ID)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		k := item.Key()
		if len(k) != len(prefix)+4 {
			return fmt.Errorf("volume %q: snapshot key %x: %w", rec.Name, k, ErrCorrupt)
		}
		epoch := binary.BigEndian.Uint32(k[len(prefix):])
		err := item.Value(func(v []byte) error {
			s, err := decodeSnap(rec.Name, epoch, v)
			rec.Snapshots = append(rec.Snapshots, s)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *thinBackend) recordByID(txn *badger.Txn, id uint32) (*thinRecord, error) {
	item, err := txn.Get(idKey(tkVolumeID, id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("volume id %d: %w", id, ErrNotFound)
	} else if err != nil {
		return nil, err
	}
	name, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	return b.getRecord(txn, string(name))
}

// putRecord stores rec: its snapshots that differ from those stored (a new
// one, one being deleted, one gone), each under its key, then the record
// without them. A change to the snapshots draws a new SnapTag.
func (b *thinBackend) putRecord(txn *badger.Txn, rec *thinRecord) error {
	for i := 1; i < len(rec.Snapshots); i++ {
		if rec.Snapshots[i].Epoch <= rec.Snapshots[i-1].Epoch {
			return fmt.Errorf("writing record %q: snapshots out of epoch order: %w", rec.Name, ErrCorrupt)
		}
	}
	var old []thinSnap // stored under snapshot keys, by epoch
	switch stored, err := b.lookupRecord(txn, rec.Name, false); {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	case stored.ID != rec.ID:
		return fmt.Errorf("writing record %q of id %d over that of id %d: %w", rec.Name, rec.ID, stored.ID, ErrCorrupt)
	case stored.Version == thinRecordVersion:
		// Those of a record of version 1 have no keys yet: all are written.
		old = stored.Snapshots
	}
	// Both lists are in epoch order: one merge finds what changed.
	changed := false
	i, j := 0, 0
	for i < len(rec.Snapshots) || j < len(old) {
		switch {
		case j == len(old) || i < len(rec.Snapshots) && rec.Snapshots[i].Epoch < old[j].Epoch:
			// New, or changed (below).
		case i == len(rec.Snapshots) || old[j].Epoch < rec.Snapshots[i].Epoch:
			if err := txn.Delete(snapKey(rec.ID, old[j].Epoch)); err != nil {
				return err
			}
			changed = true
			j++
			continue
		default: // the same epoch
			j++
			if sameSnap(&old[j-1], &rec.Snapshots[i]) {
				i++
				continue
			}
		}
		s := &rec.Snapshots[i]
		v, err := encodeSnap(s)
		if err != nil {
			return err
		}
		if err := txn.Set(snapKey(rec.ID, s.Epoch), v); err != nil {
			return err
		}
		changed = true
		i++
	}
	if changed {
		rec.SnapTag = newSnapTag()
	}
	v, err := encodeThinRecord(rec)
	if err != nil {
		return err
	}
	if err := rec.check(rec.Name); err != nil {
		return fmt.Errorf("writing a bad record: %w", err)
	}
	if err := txn.Set(thinVolumeKey(rec.Name), v); err != nil {
		return err
	}
	// What the next lookup reads is rec: decoding an encoded record gives
	// it back (TestThinRecordRoundTrip), and its snapshots are those just
	// written.
	b.recs.put(rec.Name, v, rec)
	return txn.Set(idKey(tkVolumeID, rec.ID), []byte(rec.Name))
}

// records returns every volume record.
func (b *thinBackend) records(txn *badger.Txn) ([]*thinRecord, error) {
	var names []string
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkVolume}})
	for it.Rewind(); it.Valid(); it.Next() {
		names = append(names, string(it.Item().Key()[1:]))
	}
	// Closed before the lookups, which may iterate over snapshot keys.
	it.Close()
	out := make([]*thinRecord, 0, len(names))
	for _, name := range names {
		rec, err := b.getRecord(txn, name)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// update runs fn in a metadata transaction (metaMu held) and makes it
// durable.
func (b *thinBackend) update(fn func(txn *badger.Txn) error) error { return b.transact(false, fn) }

// grow is update for a change that adds to the metadata (a volume, a
// snapshot, a clone, attributes): on a file system filled below the floor
// badger needs, it fails with ErrNoSpace instead (spaceGuard.metaRoom).
// Changes that give space back go through update.
func (b *thinBackend) grow(fn func(txn *badger.Txn) error) error { return b.transact(true, fn) }

func (b *thinBackend) transact(grows bool, fn func(txn *badger.Txn) error) error {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if err := b.checkFailed(); err != nil {
		return err
	}
	if grows {
		if err := b.pool.space.metaRoom(); err != nil {
			return err
		}
	} else {
		b.pool.space.beforeMeta()
	}
	if err := b.syncBeforeTxn(); err != nil {
		return b.fail(err)
	}
	if err := b.db.Update(fn); err != nil {
		return err
	}
	return b.syncMeta()
}

// newVolumeID assigns the id of new volume name, or fails with ErrExists.
func (b *thinBackend) newVolumeID(txn *badger.Txn, name string) (uint32, error) {
	if _, err := b.getRecord(txn, name); err == nil {
		return 0, ErrExists
	} else if !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	return newID(txn)
}

// newID assigns the next volume id.
func newID(txn *badger.Txn) (uint32, error) {
	var last uint32
	item, err := txn.Get(thinLastIDKey)
	switch {
	case err == nil:
		v, err := item.ValueCopy(nil)
		if err != nil {
			return 0, err
		}
		if len(v) != 4 {
			return 0, fmt.Errorf("volume id counter is %d bytes: %w", len(v), ErrCorrupt)
		}
		last = binary.BigEndian.Uint32(v)
	case !errors.Is(err, badger.ErrKeyNotFound):
		return 0, err
	}
	if last == math.MaxUint32 {
		return 0, fmt.Errorf("volume ids exhausted: %w", ErrInvalid)
	}
	return last + 1, txn.Set(thinLastIDKey, binary.BigEndian.AppendUint32(nil, last+1))
}

// maxThinClusters bounds the size of a thin volume: no more clusters than
// the store can address (entryPhysBits), 64 PiB with 64 KiB clusters. It
// keeps the in-memory map's directory slice (clusterMap) at most 32 MiB,
// reached only by a write near the end of a volume that large.
const maxThinClusters = 1 << entryPhysBits

// checkThinSize refuses a thin volume size past maxThinClusters clusters.
func (b *thinBackend) checkThinSize(size int64) error {
	if maxSize := int64(maxThinClusters) * b.cs; size > maxSize {
		return fmt.Errorf("size %d is more than a thin volume can have with %d KiB clusters (%d PiB): %w",
			size, b.cs>>10, maxSize>>50, ErrInvalid)
	}
	return nil
}

func (b *thinBackend) createVolume(_ context.Context, info VolumeInfo, opts CreateOptions) (VolumeInfo, error) {
	rec := &thinRecord{Name: info.Name, Kind: KindThin, Size: info.Size, Created: info.Created, Meta: info.Meta, Epoch: 1}
	if opts.Raw != "" {
		// Kept absolute: the file checked now is the one every later open
		// serves, whatever the working directory of the process then.
		raw, err := filepath.Abs(opts.Raw)
		if err != nil {
			return VolumeInfo{}, fmt.Errorf("raw: %w", err)
		}
		size, err := rawSize(raw)
		if err != nil {
			return VolumeInfo{}, err
		}
		if info.Size != 0 && info.Size != size {
			return VolumeInfo{}, fmt.Errorf("raw %s has %d bytes, not %d: %w", raw, size, info.Size, ErrInvalid)
		}
		rec.Kind, rec.RawPath, rec.Size = KindRaw, raw, size
	} else if err := b.checkThinSize(info.Size); err != nil {
		return VolumeInfo{}, err
	}
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	err := b.grow(func(txn *badger.Txn) error {
		if rec.Kind == KindRaw {
			all, err := b.records(txn)
			if err != nil {
				return err
			}
			if err := checkRawPath(b.dir, rec.RawPath, all); err != nil {
				return err
			}
		}
		id, err := b.newVolumeID(txn, rec.Name)
		if err != nil {
			return err
		}
		rec.ID = id
		return b.putRecord(txn, rec)
	})
	if err != nil {
		return VolumeInfo{}, err
	}
	return rec.info(), nil
}

func (b *thinBackend) record(name string) (*thinRecord, error) {
	var rec *thinRecord
	err := b.db.View(func(txn *badger.Txn) error {
		var err error
		rec, err = b.getRecord(txn, name)
		return err
	})
	return rec, err
}

func (b *thinBackend) getVolume(_ context.Context, name string) (VolumeInfo, error) {
	rec, err := b.record(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return b.describe(nil, rec), nil
}

// describe returns a record's identity fields; with txn set, the name of a
// clone's origin too.
func (b *thinBackend) describe(txn *badger.Txn, rec *thinRecord) VolumeInfo {
	info := rec.info()
	if txn != nil && rec.Origin != nil {
		if o, err := b.recordByID(txn, rec.Origin.ID); err == nil {
			if s := o.snapByEpoch(rec.Origin.Epoch); s != nil {
				info.Origin = o.Name + "@" + s.Name
			}
		}
	}
	return info
}

func (b *thinBackend) statVolume(ctx context.Context, name string) (VolumeInfo, error) {
	if err := b.committer.Sync(ctx); err != nil {
		return VolumeInfo{}, err
	}
	var info VolumeInfo
	err := b.db.View(func(txn *badger.Txn) error {
		rec, err := b.getRecord(txn, name)
		if err != nil {
			return err
		}
		all, err := b.records(txn)
		if err != nil {
			return err
		}
		info, err = b.stat(ctx, txn, rec, all)
		return err
	})
	return info, err
}

func (b *thinBackend) listVolumes(ctx context.Context) ([]VolumeInfo, error) {
	if err := b.committer.Sync(ctx); err != nil {
		return nil, err
	}
	var infos []VolumeInfo
	err := b.db.View(func(txn *badger.Txn) error {
		all, err := b.records(txn)
		if err != nil {
			return err
		}
		for _, rec := range all {
			info, err := b.stat(ctx, txn, rec, all)
			if err != nil {
				return err
			}
			infos = append(infos, info)
		}
		return nil
	})
	return infos, err
}

// stat describes a volume with its space figures and snapshots, from the
// committed metadata.
func (b *thinBackend) stat(ctx context.Context, txn *badger.Txn, rec *thinRecord, all []*thinRecord) (VolumeInfo, error) {
	info := b.describe(txn, rec)
	if rec.Kind == KindRaw {
		// One volume's missing file must not fail the listing of all the
		// others (and with it rtarget serve's start and /healthz).
		size, n, err := rawStat(rec.RawPath)
		if err != nil {
			info.Size, info.Unavailable = 0, err.Error()
			return info, nil
		}
		info.Size, info.Allocated, info.Exclusive = size, n, n
		return info, nil
	}
	latest := rec.latest()
	var alloc, excl int64
	err := scanEntries(ctx, txn, idKey(tkMap, rec.ID), func(_ uint64, e entry) error {
		if e.phys() == 0 {
			return nil
		}
		alloc++
		if e.birth() <= latest {
			return nil // shared with the latest snapshot
		}
		if e.counted() {
			// A rollback's: the head's alone once no reference count
			// is kept, the other references gone (snapshots deleted).
			if _, err := txn.Get(refKey(e.phys())); err == nil {
				return nil
			} else if !errors.Is(err, badger.ErrKeyNotFound) {
				return err
			}
		}
		excl++
		return nil
	})
	if err != nil {
		return VolumeInfo{}, err
	}
	info.Allocated, info.Exclusive = alloc*b.cs, excl*b.cs
	info.Snapshots = []SnapshotInfo{}
	var pred *thinSnap
	for i := range rec.Snapshots {
		s := &rec.Snapshots[i]
		if s.Deleting {
			continue
		}
		n, err := b.snapExclusive(ctx, txn, rec.ID, s, pred)
		if err != nil {
			return VolumeInfo{}, err
		}
		info.Snapshots = append(info.Snapshots, SnapshotInfo{Name: s.Name, Created: s.Created, Size: s.Size,
			Exclusive: n * b.cs, Clones: clonesOf(all, rec.ID, s.Epoch)})
		pred = s
	}
	return info, nil
}

// snapExclusive counts the clusters only snapshot s holds: those of its
// delta that its predecessor does not read through (it has the cluster in
// its own delta, or there is none) and that have no other reference.
func (b *thinBackend) snapExclusive(ctx context.Context, txn *badger.Txn, id uint32, s, pred *thinSnap) (int64, error) {
	var n int64
	err := scanEntries(ctx, txn, deltaPrefix(id, s.Epoch), func(c uint64, e entry) error {
		if e.phys() == 0 {
			return nil
		}
		if pred != nil {
			if _, found, err := getEntry(txn, deltaKey(id, pred.Epoch, c)); err != nil || !found {
				return err
			}
		}
		if _, err := txn.Get(refKey(e.phys())); err == nil {
			return nil
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		n++
		return nil
	})
	return n, err
}

// scanEntries calls fn for every map or delta entry under prefix.
func scanEntries(ctx context.Context, txn *badger.Txn, prefix []byte, fn func(c uint64, e entry) error, keys ...*[][]byte) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	i := 0
	for it.Rewind(); it.Valid(); it.Next() {
		if i++; i%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		item := it.Item()
		e, err := itemEntry(item)
		if err == nil {
			err = fn(keyCluster(item.Key()), e)
		}
		if err != nil {
			return err
		}
		for _, k := range keys {
			*k = append(*k, item.KeyCopy(nil))
		}
	}
	return nil
}

// errStopScan ends a scanEntries early.
var errStopScan = errors.New("stop scan")

// clonesOf returns the names of the volumes cloned from snapshot epoch of
// volume id, sorted.
func clonesOf(all []*thinRecord, id, epoch uint32) []string {
	var out []string
	for _, r := range all {
		if r.Origin != nil && r.Origin.ID == id && r.Origin.Epoch == epoch {
			out = append(out, r.Name)
		}
	}
	sort.Strings(out)
	return out
}

// dependents fails with ErrHasDependents if a snapshot of rec (of epoch
// only, when not 0) has clones.
func (b *thinBackend) dependents(txn *badger.Txn, rec *thinRecord, only uint32) error {
	all, err := b.records(txn)
	if err != nil {
		return err
	}
	for _, s := range rec.Snapshots {
		if only != 0 && s.Epoch != only {
			continue
		}
		if cl := clonesOf(all, rec.ID, s.Epoch); len(cl) > 0 {
			return fmt.Errorf("snapshot %q has clones %v: %w", s.Name, cl, ErrHasDependents)
		}
	}
	return nil
}

func (b *thinBackend) deleteVolume(ctx context.Context, info VolumeInfo) error {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	if err := b.committer.Sync(ctx); err != nil {
		return err
	}
	var rec *thinRecord
	err := b.update(func(txn *badger.Txn) error {
		var err error
		if rec, err = b.getRecord(txn, info.Name); err != nil {
			return err
		}
		if rec.ID != info.ID {
			return fmt.Errorf("volume %q was recreated: %w", info.Name, ErrNotFound)
		}
		if err := b.dependents(txn, rec, 0); err != nil {
			return err
		}
		if err := txn.Delete(thinVolumeKey(rec.Name)); err != nil {
			return err
		}
		b.recs.drop(rec.Name)
		if err := txn.Delete(idKey(tkVolumeID, rec.ID)); err != nil {
			return err
		}
		return txn.Set(idKey(tkReap, rec.ID), nil)
	})
	if err != nil {
		return err
	}
	b.volsMu.Lock()
	delete(b.rawFailed, rec.ID) // a failed raw volume deleted: the store is healthy again
	b.volsMu.Unlock()
	return b.reap(rec.ID)
}

// reap releases the map and deltas of deleted volume id, in transactions
// of bounded size, then its marker. A crash in between leaves the marker:
// the next open goes on.
func (b *thinBackend) reap(id uint32) error {
	for _, prefix := range [][]byte{idKey(tkMap, id), idKey(tkDelta, id)} {
		for {
			more, err := b.releaseKeys(prefix)
			if err != nil {
				return fmt.Errorf("release the data of deleted volume %d: %w", id, err)
			}
			if !more {
				break
			}
		}
	}
	// Its snapshot keys (the records of those snapshots: no data).
	for {
		more := false
		err := b.update(func(txn *badger.Txn) error {
			var keys [][]byte
			it := txn.NewIterator(badger.IteratorOptions{Prefix: idKey(tkSnap, id)})
			for it.Rewind(); it.Valid(); it.Next() {
				if len(keys) == b.batchCap {
					more = true
					break
				}
				keys = append(keys, it.Item().KeyCopy(nil))
			}
			it.Close()
			return deleteKeys(txn, keys)
		})
		if err != nil {
			return fmt.Errorf("delete the snapshots of deleted volume %d: %w", id, err)
		}
		if !more {
			break
		}
	}
	return b.update(func(txn *badger.Txn) error { return txn.Delete(idKey(tkReap, id)) })
}

// releaseKeys deletes up to a batch of entries under prefix, dropping the
// references they hold. It reports whether entries remain.
func (b *thinBackend) releaseKeys(prefix []byte) (more bool, err error) {
	err = b.metaStep(func(txn *badger.Txn, drop func(p uint64) error) error {
		var keys [][]byte
		err := scanEntries(context.Background(), txn, prefix, func(_ uint64, e entry) error {
			if len(keys) == b.batchCap {
				more = true
				return errStopScan
			}
			return drop(e.phys())
		}, &keys)
		if err != nil && !errors.Is(err, errStopScan) {
			return err
		}
		return deleteKeys(txn, keys)
	})
	return more, err
}

func deleteKeys(txn *badger.Txn, keys [][]byte) error {
	for _, k := range keys {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// metaStep runs fn in one metadata transaction and makes it durable. drop
// releases one reference to a cluster (0: none); the clusters that lose
// their last one become free ranges in the same transaction, and holes
// that can be handed out again after it.
func (b *thinBackend) metaStep(fn func(txn *badger.Txn, drop func(p uint64) error) error) error {
	b.metaMu.Lock()
	b.pool.space.beforeMeta()
	var freed []uint64
	if err := b.syncBeforeTxn(); err != nil {
		b.metaMu.Unlock()
		return b.fail(err)
	}
	err := b.db.Update(func(txn *badger.Txn) error {
		drop := func(p uint64) error {
			if p == 0 {
				return nil
			}
			gone, err := decref(txn, p)
			if gone {
				freed = append(freed, p)
			}
			return err
		}
		if err := fn(txn, drop); err != nil {
			return err
		}
		for _, p := range freed {
			b.durable.add(p, p+1)
		}
		return b.putRanges(txn)
	})
	if err == nil {
		err = b.syncMeta()
	}
	b.metaMu.Unlock()
	if err != nil {
		return b.fail(err)
	}
	return b.release(freed)
}

func (b *thinBackend) resizeVolume(ctx context.Context, info VolumeInfo, size int64, _ bool) error {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	rec, err := b.record(info.Name)
	if err != nil {
		return err
	}
	if rec.Kind == KindRaw {
		// Its size is its file's: a resize to that size changes nothing
		// and succeeds, as one of a thin volume to its size does.
		cur, _, err := rawStat(rec.RawPath)
		if err != nil {
			return fmt.Errorf("a raw volume has its file's size, unknown now: %w: %w", ErrNotSupported, err)
		}
		if size != cur {
			return fmt.Errorf("a raw volume has its file's size, %d bytes: %w", cur, ErrNotSupported)
		}
		return nil
	}
	if err := b.checkThinSize(size); err != nil {
		return err
	}
	if size < rec.Size {
		// The blocks past the new end go first, through the data path (it
		// knows shared clusters and partial ones).
		v, err := b.acquireVol(ctx, rec.Name)
		if err != nil {
			return err
		}
		d := &thinDevice{v: v}
		err = d.discard(ctx, uint64(size)/BlockSize, uint64(rec.Size-size)/BlockSize, true)
		b.releaseVol(v)
		if err != nil {
			return err
		}
	}
	b.volsMu.Lock()
	defer b.volsMu.Unlock()
	err = b.update(func(txn *badger.Txn) error {
		rec, err := b.getRecord(txn, info.Name)
		if err != nil {
			return err
		}
		rec.Size = size
		return b.putRecord(txn, rec)
	})
	if err != nil {
		return err
	}
	if v := b.vols[rec.ID]; v != nil {
		v.size.Store(uint64(size) / BlockSize)
	}
	return nil
}

func (b *thinBackend) setMeta(_ context.Context, info VolumeInfo, meta map[string]string) error {
	b.catalogMu.Lock()
	defer b.catalogMu.Unlock()
	return b.grow(func(txn *badger.Txn) error {
		rec, err := b.getRecord(txn, info.Name)
		if err != nil {
			return err
		}
		rec.Meta = meta
		return b.putRecord(txn, rec)
	})
}

func (b *thinBackend) open(ctx context.Context, info VolumeInfo, snap string) (blockDevice, VolumeInfo, error) {
	var rec *thinRecord
	var vi VolumeInfo
	err := b.db.View(func(txn *badger.Txn) error {
		var err error
		if rec, err = b.getRecord(txn, info.Name); err != nil {
			return err
		}
		vi = b.describe(txn, rec)
		return nil
	})
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	if snap != "" {
		s, err := rec.snap(snap)
		if err != nil {
			return nil, VolumeInfo{}, err
		}
		// A snapshot is read from the database: what the batch holds of the
		// volume from before the snapshot goes there first.
		if err := b.committer.Sync(ctx); err != nil {
			return nil, VolumeInfo{}, err
		}
		vi.Name, vi.Size, vi.Created, vi.ReadOnly = rec.Name+"@"+snap, s.Size, s.Created, true
		return b.openSnapshot(rec, s), vi, nil
	}
	if rec.Kind == KindRaw {
		d, err := b.openRaw(rec)
		return d, vi, err
	}
	v, err := b.acquireVol(ctx, rec.Name)
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	return &thinDevice{v: v}, vi, nil
}

// acquireVol returns the state of a thin volume, loading it for its first
// handle.
func (b *thinBackend) acquireVol(ctx context.Context, name string) (*thinVol, error) {
	b.volsMu.Lock()
	defer b.volsMu.Unlock()
	rec, err := b.record(name)
	if err != nil {
		return nil, err
	}
	if v := b.vols[rec.ID]; v != nil {
		v.handles++
		return v, nil
	}
	// Whatever the batch holds of the volume (from handles closed since)
	// goes to the database first, so the map read is current.
	if err := b.committer.Sync(ctx); err != nil {
		return nil, err
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if rec, err = b.record(name); err != nil {
		return nil, err
	}
	v, err := b.loadVol(rec)
	if err != nil {
		return nil, err
	}
	v.handles = 1
	b.vols[rec.ID] = v
	return v, nil
}

func (b *thinBackend) releaseVol(v *thinVol) {
	b.volsMu.Lock()
	defer b.volsMu.Unlock()
	if v.handles--; v.handles == 0 {
		delete(b.vols, v.id)
	}
}

// liveSnapshots returns the names of a record's snapshots, oldest first.
func liveSnapshots(rec *thinRecord) []string {
	var out []string
	for _, s := range rec.Snapshots {
		if !s.Deleting {
			out = append(out, s.Name)
		}
	}
	return slices.Clip(out)
}
