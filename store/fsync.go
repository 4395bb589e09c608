package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

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

// mkdirAllDurable is os.MkdirAll whose new directories' names are durable:
// each directory it creates is fsynced into its parent, as POSIX requires
// for a name to survive a crash.
func mkdirAllDurable(path string) error {
	path = filepath.Clean(path)
	if st, err := os.Stat(path); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("mkdir %s: %w", path, syscall.ENOTDIR)
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("mkdir: %w", err)
	}
	parent := filepath.Dir(path)
	if parent != path {
		if err := mkdirAllDurable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("mkdir: %w", err)
	}
	return fsyncPath(parent)
}
