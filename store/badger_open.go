package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// openBadger opens the badger database of opts.Dir once the empty memtable
// WALs a power failure may have left there are removed (removeEmptyWALs).
func openBadger(opts badger.Options, log *slog.Logger) (*badger.DB, error) {
	if err := removeEmptyWALs(opts.Dir, log); err != nil {
		return nil, err
	}
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("badger: %w", err)
	}
	return db, nil
}

// removeEmptyWALs removes the memtable WALs (NNNNN.mem) of length zero
// from badger directory dir. Badger (v4.9.6) refuses to open a directory
// holding one ("while opening memtables ... Create a new file"), and a
// power failure can leave one in two ways, each a file whose later change
// did not reach the disk:
//   - badger deletes the WAL of a memtable it has made a table of by
//     truncating the file to zero, then unlinking it; a journal commit
//     between the two (any fsync on the file system, one of ours among
//     them) makes the truncation durable without the unlink. The WAL's
//     transactions are in the table, which the manifest named before.
//   - badger makes a new WAL by creating the file, then extending it; a
//     commit between the two keeps the name without the length. Nothing
//     was ever written into the file.
//
// Either way the file holds nothing, and removing it is what badger was
// doing or would do. The removals are made durable before badger opens:
// it may make a new WAL of the same name.
func removeEmptyWALs(dir string, log *slog.Logger) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("badger directory: %w", err)
	}
	var removed []string
	for _, e := range entries {
		num, ok := strings.CutSuffix(e.Name(), ".mem")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if _, err := strconv.ParseUint(num, 10, 32); err != nil {
			continue // not badger's: badger refuses it itself
		}
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("badger directory: %w", err)
		}
		if info.Size() != 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove an empty WAL: %w", err)
		}
		removed = append(removed, e.Name())
	}
	if len(removed) == 0 {
		return nil
	}
	if err := fsyncPath(dir); err != nil {
		return fmt.Errorf("remove an empty WAL: %w", err)
	}
	log.Warn("removed empty metadata WALs a crash left behind: they held nothing",
		"badger_dir", dir, "files", strings.Join(removed, ","))
	return nil
}
