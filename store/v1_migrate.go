package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/rnic-dev/rnic/rnic/crc32c"
)

// Migration of a v1 store (one badger value per block, in the data
// directory itself) to the thin store. See doc.go (Migration from v1).
//
// The v1 layout, read here only: key 0x00 the format marker "rnic-store
// v1"; 0x02|name a volume record (JSON); 0x03|id a deleted volume whose
// blocks were still to reap; 0x10|id|lba (4 + 8 bytes, big-endian) a block:
// its CRC-32C (4 bytes, big-endian) then its 4096 bytes.

const (
	v1Magic        = "rnic-store v1"
	v1PrefixVolume = 0x02
	v1PrefixBlock  = 0x10
	v1ValueLen     = 4 + BlockSize
	// migrateDir holds the thin store being built until it is complete.
	migrateDir = "migrate.tmp"
	// migrateDone marks a complete migrateDir.
	migrateDone = "COMPLETE"
	// v1Backup receives the v1 files once the thin store is in place.
	v1Backup = "v1"
)

// ErrMigrating: a migration was interrupted; running it again finishes it.
var ErrMigrating = errors.New("directory holds an interrupted v1 migration")

type v1Record struct {
	Name    string            `json:"name"`
	ID      uint32            `json:"id"`
	Size    int64             `json:"size"`
	Created time.Time         `json:"created"`
	Meta    map[string]string `json:"meta,omitempty"`
}

// MigrateReport says what MigrateV1 did.
type MigrateReport struct {
	Volumes []MigratedVolume
	Backup  string // the directory the v1 files were moved to
}

// MigratedVolume is one volume copied from the v1 store.
type MigratedVolume struct {
	Name    string // in the thin store
	OldName string // in the v1 store, if it had to change
	Size    int64
	Blocks  int64 // blocks copied (the v1 store held no others)
}

// MigrateV1 converts the v1 store in dir into a thin store in place: it
// builds the thin store in dir/migrate.tmp from the v1 volumes (every
// stored block checked against its CRC; a bad one stops the migration),
// then moves the v1 files to dir/v1 and the thin store into dir. The v1
// files are kept: delete dir/v1 once the thin store serves what it should.
// An interrupted migration is finished by running it again; until then
// OpenThin refuses dir with ErrMigrating. progress, if not nil, is called
// as volumes are copied.
func MigrateV1(ctx context.Context, dir string, opts ThinOptions, progress func(vol string, done, total int64)) (MigrateReport, error) {
	opts = opts.withDefaults()
	var rep MigrateReport
	tmp := filepath.Join(dir, migrateDir)
	_, errDone := os.Stat(filepath.Join(tmp, migrateDone))
	if errDone != nil && !IsV1Store(dir) {
		return rep, fmt.Errorf("migrate %s: no v1 store there", dir)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return rep, fmt.Errorf("migrate %s: %w", dir, err)
	}
	defer lock.unlock()
	if errDone != nil {
		if rep.Volumes, err = copyV1(ctx, dir, tmp, opts, progress); err != nil {
			return rep, fmt.Errorf("migrate %s (the v1 store is left as it was): %w", dir, errors.Join(err, os.RemoveAll(tmp)))
		}
	}
	rep.Backup = filepath.Join(dir, v1Backup)
	if err := swapV1(dir); err != nil {
		return rep, fmt.Errorf("migrate %s: %w", dir, err)
	}
	return rep, nil
}

// copyV1 builds the thin store in tmp from the v1 store in dir.
func copyV1(ctx context.Context, dir, tmp string, opts ThinOptions, progress func(string, int64, int64)) ([]MigratedVolume, error) {
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	db, err := openBadger(badger.DefaultOptions(dir).
		WithLogger(slogBadger{log: opts.Logger.With("component", "badger-v1"), min: slog.LevelWarn}).
		WithMetricsEnabled(false).WithNumCompactors(2).WithCompactL0OnClose(false),
		opts.Logger.With("component", "store", "dir", dir))
	if err != nil {
		return nil, fmt.Errorf("open the v1 store: %w", err)
	}
	defer db.Close()
	recs, err := v1Records(db)
	if err != nil {
		return nil, err
	}
	st, err := OpenThin(tmp, opts)
	if err != nil {
		return nil, err
	}
	var out []MigratedVolume
	taken := map[string]bool{}
	for _, r := range recs {
		mv := MigratedVolume{Name: v1Name(r.Name, taken), Size: r.Size}
		if mv.Name != r.Name {
			mv.OldName = r.Name
		}
		meta := make(map[string]string, len(r.Meta)+1)
		for k, v := range r.Meta {
			meta[k] = v
		}
		meta["v1-created"] = r.Created.Format(time.RFC3339Nano)
		if mv.OldName != "" {
			meta["v1-name"] = r.Name
		}
		mv.Blocks, err = copyV1Volume(ctx, db, st, r, mv.Name, meta, progress)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("volume %q: %w", r.Name, err)
		}
		out = append(out, mv)
	}
	if err := st.Close(); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(tmp, migrateDone))
	if err == nil {
		err = errors.Join(f.Sync(), f.Close(), fsyncPath(tmp))
	}
	return out, err
}

// v1Name returns the thin name of v1 volume name: '@' and '/' are not
// allowed any more and become '_' (with a suffix if that name is taken).
func v1Name(name string, taken map[string]bool) string {
	n := strings.NewReplacer("@", "_", "/", "_").Replace(name)
	for i := 2; taken[n]; i++ {
		n = fmt.Sprintf("%s_%d", strings.NewReplacer("@", "_", "/", "_").Replace(name), i)
	}
	taken[n] = true
	return n
}

// v1Records reads the format marker and the volume records.
func v1Records(db *badger.DB) ([]v1Record, error) {
	var recs []v1Record
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte{0x00})
		if err != nil {
			return fmt.Errorf("v1 format marker: %w", err)
		}
		magic, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		if string(magic) != v1Magic {
			return fmt.Errorf("format marker %q, want %q: %w", magic, v1Magic, ErrCorrupt)
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{v1PrefixVolume}, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			var r v1Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("v1 volume record %q: %w: %w", it.Item().Key()[1:], err, ErrCorrupt)
			}
			if r.ID == 0 || r.Size <= 0 || r.Size%BlockSize != 0 {
				return fmt.Errorf("v1 volume record %q: id %d size %d: %w", r.Name, r.ID, r.Size, ErrCorrupt)
			}
			recs = append(recs, r)
		}
		return nil
	})
	return recs, err
}

// copyV1Volume copies the blocks of v1 volume r into a new thin volume,
// in runs of consecutive blocks; it returns the blocks copied.
func copyV1Volume(ctx context.Context, db *badger.DB, st Store, r v1Record, name string, meta map[string]string,
	progress func(string, int64, int64)) (int64, error) {
	if _, err := st.CreateVolume(ctx, name, r.Size, CreateOptions{Meta: meta}); err != nil {
		return 0, err
	}
	v, err := st.OpenVolume(ctx, name)
	if err != nil {
		return 0, err
	}
	defer v.Close()
	const runMax = 256
	buf := make([]byte, 0, runMax*BlockSize)
	var first uint64
	var copied int64
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := v.WriteBlocks(ctx, first, buf, false)
		copied += int64(len(buf) / BlockSize)
		buf = buf[:0]
		if progress != nil {
			progress(name, int64(first)*BlockSize, r.Size)
		}
		return err
	}
	prefix := binary.BigEndian.AppendUint32([]byte{v1PrefixBlock}, r.ID)
	err = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 64})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != 13 {
				return fmt.Errorf("v1 block key %x: %w", k, ErrCorrupt)
			}
			lba := binary.BigEndian.Uint64(k[5:])
			if lba >= uint64(r.Size)/BlockSize {
				return fmt.Errorf("v1 block %d past the end (%d bytes): %w", lba, r.Size, ErrCorrupt)
			}
			if len(buf) > 0 && (lba != first+uint64(len(buf)/BlockSize) || len(buf) == cap(buf)) {
				if err := flush(); err != nil {
					return err
				}
			}
			if len(buf) == 0 {
				first = lba
			}
			err := it.Item().Value(func(val []byte) error {
				if len(val) != v1ValueLen {
					return fmt.Errorf("block %d: stored value of %d bytes: %w", lba, len(val), ErrChecksum)
				}
				n := len(buf)
				buf = buf[:n+BlockSize]
				if got, want := crc32c.UpdateCopy(0, buf[n:], val[4:]), binary.BigEndian.Uint32(val); got != want {
					return fmt.Errorf("block %d: crc32c %08x, stored %08x: %w", lba, got, want, ErrChecksum)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		return flush()
	})
	if err != nil {
		return copied, err
	}
	return copied, v.Flush(ctx)
}

// swapV1 moves the v1 files of dir into dir/v1 and the complete thin store
// of dir/migrate.tmp into dir. Each step can be done again after a crash.
func swapV1(dir string) error {
	backup := filepath.Join(dir, v1Backup)
	if err := os.MkdirAll(backup, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case lockFileName, migrateDir, v1Backup, thinMetaDir, thinDataDir:
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(backup, e.Name())); err != nil {
			return err
		}
	}
	if err := fsyncPath(backup); err != nil {
		return err
	}
	tmp := filepath.Join(dir, migrateDir)
	for _, d := range []string{thinMetaDir, thinDataDir} {
		if _, err := os.Stat(filepath.Join(tmp, d)); err != nil {
			continue // moved already
		}
		if err := os.Rename(filepath.Join(tmp, d), filepath.Join(dir, d)); err != nil {
			return err
		}
	}
	if err := fsyncPath(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	return fsyncPath(dir)
}
