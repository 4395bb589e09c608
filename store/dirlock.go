package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFileName is the file in a data directory that a Store holds an
// exclusive flock(2) on while it is open. badger keeps a lock of its own;
// this one exists to fail early with ErrLocked, a clear, typed error.
const lockFileName = "store.lock"

// dirLock is a held lock on a data directory.
type dirLock struct{ f *os.File }

// lockDir takes the lock of dir without waiting.
func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Record the holder for people looking at the directory; best effort.
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) unlock() error {
	return l.f.Close() // closing the only descriptor drops the flock
}
