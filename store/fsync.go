package store

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// syncBadgerDir fsyncs, in a badger directory, the value log files
// (*.vlog), then the memtable WALs (*.mem) from the oldest to the newest,
// then the directory itself: db.Sync covers the WAL of the mutable
// memtable only (badger v4.9.6), not those of full memtables still
// waiting to become tables, and badger never syncs the directory entries
// of the files it creates.
//
// The order is that of the transactions. Badger writes each transaction
// to the WAL of the memtable current then and starts a new WAL when the
// memtable is full, and the WALs are written through memory maps, whose
// writeback nothing orders but a sync. A commit whose transactions span
// two WALs, its newer one synced first, could leave after a power cut a
// later transaction without an earlier one: a trim of a cluster without
// the copy on write before it, which had moved the snapshot's cluster to
// its delta, so that the snapshot's data was freed at the next open
// (TestWALOrderPowerCut). The value log goes first since a WAL entry may
// point into it. The files of a memtable are numbered NNNNN.mem, in the
// order they were made, with more digits past 99999.
func syncBadgerDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	var vlogs, mems []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".vlog":
			vlogs = append(vlogs, e.Name())
		case ".mem":
			mems = append(mems, e.Name())
		}
	}
	// Numbers of one width sort as strings; a longer one is larger.
	slices.SortFunc(mems, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
	})
	for _, name := range append(vlogs, mems...) {
		if err := fsyncPath(filepath.Join(dir, name)); err != nil {
			return err
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
