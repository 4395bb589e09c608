package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// syncAll makes everything committed so far durable. It is the function
// behind the sync group: Flush, FUA writes and Store.Sync share its runs.
//
// db.Sync covers the value log and the WAL of the mutable memtable only.
// The WALs of full memtables still waiting to become tables are not synced
// by it (badger v4.9.6), and new files' directory entries are never synced,
// so syncAll also fsyncs every *.mem file and the directory.
func (b *badgerBackend) syncAll() error {
	if err := b.db.Sync(); err != nil {
		return fmt.Errorf("badger sync: %w", err)
	}
	if err := syncBadgerDir(b.dir); err != nil {
		return err
	}
	b.syncs.Add(1)
	return nil
}

// syncBadgerDir fsyncs the memtable WALs (*.mem) of a badger directory and
// the directory itself: db.Sync covers the WAL of the mutable memtable
// only (badger v4.9.6), not those of full memtables still waiting to
// become tables, and badger never syncs the directory entries of the files
// it creates.
func syncBadgerDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".mem") {
			if err := fsyncPath(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return fsyncPath(dir)
}

// fsyncPath fsyncs a file or directory; a file removed meanwhile (a memtable
// that became a table) is fine.
func fsyncPath(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	errSync := f.Sync()
	errClose := f.Close()
	if err := errors.Join(errSync, errClose); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
