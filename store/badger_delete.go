package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// deleteVolume removes the record and marks the volume's blocks for
// reaping in one transaction, then reaps them. Volume ids are never reused,
// so blocks not yet reaped (after a crash or a cancelled ctx) are invisible;
// the maintenance goroutine finishes the job.
func (b *badgerBackend) deleteVolume(ctx context.Context, info VolumeInfo) error {
	err := b.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(volumeKey(info.Name))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		err = item.Value(func(v []byte) error {
			cur, err := decodeVolumeRecord(info.Name, v)
			if err == nil && cur.ID != info.ID {
				err = fmt.Errorf("volume %q was recreated: %w", info.Name, ErrNotFound)
			}
			return err
		})
		if err != nil {
			return err
		}
		if err := txn.Delete(volumeKey(info.Name)); err != nil {
			return err
		}
		return txn.Set(deletedKey(info.ID), nil)
	})
	if err != nil {
		return err
	}
	if err := b.sync(ctx); err != nil {
		return err
	}
	if err := b.reap(ctx, info.ID); err != nil {
		b.log.Warn("volume deleted, reaping its blocks continues in the background",
			"volume", info.Name, "id", info.ID, "err", err)
		select {
		case b.reapNow <- struct{}{}:
		default:
		}
	}
	return nil
}

// reap deletes every block of volume id, then its deletion marker.
func (b *badgerBackend) reap(ctx context.Context, id uint32) error {
	p := volumeBlocksPrefix(id)
	end := append(bytes.Clone(p), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	if _, err := b.deleteRange(ctx, p, p, end); err != nil {
		return err
	}
	if err := b.db.Update(func(txn *badger.Txn) error { return txn.Delete(deletedKey(id)) }); err != nil {
		return fmt.Errorf("clear deletion marker of volume %d: %w", id, err)
	}
	return nil
}

// reapPending reaps every volume marked deleted.
func (b *badgerBackend) reapPending(ctx context.Context) {
	var ids []uint32
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefixDeleted}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != volPrefixLen {
				return fmt.Errorf("deletion marker key %x: %w", k, ErrCorrupt)
			}
			ids = append(ids, binary.BigEndian.Uint32(k[1:]))
		}
		return nil
	})
	if err != nil {
		b.log.Error("listing deleted volumes", "err", err)
		return
	}
	for _, id := range ids {
		if err := b.reap(ctx, id); err != nil {
			if ctx.Err() == nil {
				b.log.Error("reaping deleted volume", "id", id, "err", err)
			}
			return
		}
		b.log.Info("reaped blocks of deleted volume", "id", id)
	}
}

// deleteRange deletes the keys in [from, to) that start with prefix, in
// transactions within badger's limits. It returns how many it deleted.
func (b *badgerBackend) deleteRange(ctx context.Context, prefix, from, to []byte) (int, error) {
	deleted := 0
	batch := make([][]byte, 0, min(b.txnDeletes, 1024))
	commit := func() error {
		if len(batch) == 0 {
			return nil
		}
		txn := b.db.NewTransaction(true)
		defer txn.Discard()
		for _, k := range batch {
			if err := txn.Delete(k); err != nil {
				return fmt.Errorf("delete key %x: %w", k, err)
			}
		}
		if err := txn.Commit(); err != nil {
			return fmt.Errorf("commit %d deletes: %w", len(batch), err)
		}
		deleted += len(batch)
		batch = batch[:0]
		return nil
	}
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(from); it.Valid(); it.Next() {
			k := it.Item().Key()
			if bytes.Compare(k, to) >= 0 {
				break
			}
			batch = append(batch, it.Item().KeyCopy(nil))
			if len(batch) >= b.txnDeletes {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := commit(); err != nil {
					return err
				}
			}
		}
		return commit()
	})
	return deleted, err
}
