package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// badgerDevice is the block array of one volume in a badger database.
type badgerDevice struct {
	b  *badgerBackend
	id uint32
	n  uint64 // blocks
}

// read looks every block up in one read transaction (a consistent
// snapshot); absent blocks read as zeros.
func (d *badgerDevice) read(ctx context.Context, lba uint64, dst []byte) error {
	key := newBlockKey(d.id, lba)
	if blocks := len(dst) / BlockSize; blocks > 0 {
		// The loop counts every readCheckBlocks blocks as it goes; the
		// rest here.
		defer d.b.noteRead(blocks - (blocks-1)/readCheckBlocks*readCheckBlocks)
	}
	return d.b.db.View(func(txn *badger.Txn) error {
		for i := 0; i < len(dst); i += BlockSize {
			if i%(256*BlockSize) == 0 && i > 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if b := i / BlockSize; b > 0 && b%readCheckBlocks == 0 {
				d.b.noteRead(readCheckBlocks)
			}
			n := lba + uint64(i/BlockSize)
			out := dst[i : i+BlockSize]
			key.SetLBA(n)
			item, err := txn.Get(key)
			if errors.Is(err, badger.ErrKeyNotFound) {
				clear(out)
				continue
			}
			if err == nil {
				err = item.Value(func(v []byte) error { return decodeBlockValue(out, v) })
			}
			if err != nil {
				clear(dst) // nothing of a failed read is returned
				return blockError(n, err)
			}
		}
		return nil
	})
}

// write stores src in one transaction, so it is atomic, unless it has more
// blocks than a transaction can take (more than MaxAtomicWrite bytes can
// be), in which case each transaction-sized piece is atomic.
func (d *badgerDevice) write(ctx context.Context, lba uint64, src []byte, fua bool) error {
	defer d.b.noteWrite(len(src))
	per := d.b.txnBlocks * BlockSize
	for len(src) > 0 {
		n := min(len(src), per)
		if err := d.writeTxn(lba, src[:n]); err != nil {
			return err
		}
		src = src[n:]
		lba += uint64(n / BlockSize)
		if len(src) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	if fua {
		return d.b.sync(ctx)
	}
	return nil
}

func (d *badgerDevice) writeTxn(lba uint64, src []byte) error {
	nblocks := len(src) / BlockSize
	// One allocation each for keys and values; badger holds them until the
	// transaction is written.
	keys := make([]byte, nblocks*blockKeyLen)
	vals := make([]byte, nblocks*blockValueLen)
	txn := d.b.db.NewTransaction(true)
	defer txn.Discard()
	for i := range nblocks {
		k := blockKey(keys[i*blockKeyLen : (i+1)*blockKeyLen])
		k.Set(d.id, lba+uint64(i))
		v := blockValue(vals[i*blockValueLen : (i+1)*blockValueLen])
		encodeBlockValue(v, src[i*BlockSize:])
		if err := txn.Set(k, v); err != nil {
			return blockError(lba+uint64(i), err)
		}
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// discard deletes the stored blocks in the range (only those present, found
// with a key-only scan), in transactions within badger's limits.
func (d *badgerDevice) discard(ctx context.Context, lba, count uint64, fua bool) error {
	from := newBlockKey(d.id, lba)
	to := newBlockKey(d.id, lba+count) // lba+count <= blocks < 2^52: no overflow
	if _, err := d.b.deleteRange(ctx, volumeBlocksPrefix(d.id), from, to); err != nil {
		return err
	}
	if fua {
		return d.b.sync(ctx)
	}
	return nil
}

func (d *badgerDevice) flush(ctx context.Context) error {
	return d.b.sync(ctx)
}
