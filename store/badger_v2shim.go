package store

import (
	"context"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// KindBadger is the Kind of a volume of the per-block badger store.
const KindBadger = "badger"

// The per-block badger store has no snapshots, clones or raw volumes.

func (b *badgerBackend) statVolume(ctx context.Context, name string) (VolumeInfo, error) {
	info, err := b.getVolume(ctx, name)
	if err != nil {
		return VolumeInfo{}, err
	}
	info.Kind = KindBadger
	n := 0
	err = b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: volumeBlocksPrefix(info.ID)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return ctx.Err()
	})
	info.Allocated = int64(n) * BlockSize
	info.Exclusive = info.Allocated
	return info, err
}

func (b *badgerBackend) listVolumes(ctx context.Context) ([]VolumeInfo, error) {
	infos, err := b.listRecords(ctx)
	for i := range infos {
		if err == nil {
			infos[i], err = b.statVolume(ctx, infos[i].Name)
		}
	}
	return infos, err
}

func (b *badgerBackend) resizeVolume(context.Context, VolumeInfo, int64, bool) error {
	return fmt.Errorf("resize in the badger store: %w", ErrNotSupported)
}

func (b *badgerBackend) createSnapshot(context.Context, VolumeInfo, string) (SnapshotInfo, error) {
	return SnapshotInfo{}, fmt.Errorf("snapshots in the badger store: %w", ErrNotSupported)
}

func (b *badgerBackend) deleteSnapshot(context.Context, VolumeInfo, string) error {
	return fmt.Errorf("snapshots in the badger store: %w", ErrNotSupported)
}

func (b *badgerBackend) clone(context.Context, VolumeInfo, string, VolumeInfo) (VolumeInfo, error) {
	return VolumeInfo{}, fmt.Errorf("clones in the badger store: %w", ErrNotSupported)
}

func (b *badgerBackend) rollback(context.Context, VolumeInfo, string) error {
	return fmt.Errorf("snapshots in the badger store: %w", ErrNotSupported)
}

func (b *badgerBackend) setMeta(ctx context.Context, info VolumeInfo, meta map[string]string) error {
	info.Meta = meta
	rec, err := encodeVolumeRecord(info)
	if err != nil {
		return err
	}
	if err := b.db.Update(func(txn *badger.Txn) error { return txn.Set(volumeKey(info.Name), rec) }); err != nil {
		return err
	}
	return b.sync(ctx)
}

func (b *badgerBackend) open(_ context.Context, info VolumeInfo, snap string) (blockDevice, VolumeInfo, error) {
	if snap != "" {
		return nil, VolumeInfo{}, fmt.Errorf("snapshots in the badger store: %w", ErrNotSupported)
	}
	info.Kind = KindBadger
	return &badgerDevice{b: b, id: info.ID, n: info.Blocks()}, info, nil
}

func (d *badgerDevice) blocks() uint64 { return d.n }
func (d *badgerDevice) release() error { return nil }

// blockStatus reports the blocks present with a key-only scan.
func (d *badgerDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	r := extentRun{fn: fn}
	next := lba
	err := d.b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: volumeBlocksPrefix(d.id)})
		defer it.Close()
		for it.Seek(newBlockKey(d.id, lba)); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			k, err := parseBlockKey(it.Item().Key(), d.id)
			if err != nil {
				return err
			}
			n := k.LBA()
			if n-lba >= count {
				break
			}
			if !r.add(next, n-next, true) || !r.add(n, 1, false) {
				return nil
			}
			next = n + 1
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.add(next, lba+count-next, true)
	r.done()
	return nil
}

// Syncs implements Syncer.
func (b *badgerBackend) Syncs() uint64 { return uint64(b.syncs.Load()) }
