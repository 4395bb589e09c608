package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"
)

// Volume records in badger: create, look up, list. See doc.go for the key
// layout.

func (b *badgerBackend) createVolume(ctx context.Context, info VolumeInfo, opts CreateOptions) (VolumeInfo, error) {
	if opts.Raw != "" {
		return VolumeInfo{}, fmt.Errorf("raw volumes in the badger store: %w", ErrNotSupported)
	}
	info.Kind = KindBadger
	b.createMu.Lock()
	defer b.createMu.Unlock()
	err := b.db.Update(func(txn *badger.Txn) error {
		if _, err := txn.Get(volumeKey(info.Name)); err == nil {
			return ErrExists
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		var last uint32
		item, err := txn.Get(lastIDKey)
		switch {
		case err == nil:
			err = item.Value(func(v []byte) error {
				if len(v) != 4 {
					return fmt.Errorf("volume id counter is %d bytes: %w", len(v), ErrCorrupt)
				}
				last = binary.BigEndian.Uint32(v)
				return nil
			})
			if err != nil {
				return err
			}
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		if last == math.MaxUint32 {
			return fmt.Errorf("volume ids exhausted: %w", ErrInvalid)
		}
		info.ID = last + 1
		rec, err := encodeVolumeRecord(info)
		if err != nil {
			return err
		}
		if err := txn.Set(lastIDKey, binary.BigEndian.AppendUint32(nil, info.ID)); err != nil {
			return err
		}
		return txn.Set(volumeKey(info.Name), rec)
	})
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := b.sync(ctx); err != nil {
		return VolumeInfo{}, err
	}
	return info, nil
}

func (b *badgerBackend) getVolume(_ context.Context, name string) (VolumeInfo, error) {
	var info VolumeInfo
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(volumeKey(name))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			info, err = decodeVolumeRecord(name, v)
			return err
		})
	})
	return info, err
}

func (b *badgerBackend) listRecords(ctx context.Context) ([]VolumeInfo, error) {
	var infos []VolumeInfo
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefixVolume}, PrefetchValues: true, PrefetchSize: 16})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			name := string(item.Key()[1:])
			err := item.Value(func(v []byte) error {
				info, err := decodeVolumeRecord(name, v)
				infos = append(infos, info)
				return err
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return infos, err
}
