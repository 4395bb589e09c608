package store

import (
	"context"
	"sync/atomic"
	"testing"
)

// CheckThin fails t if the thin store s breaks one of its invariants (see
// thinBackend.check).
func CheckThin(t *testing.T, s Store) {
	t.Helper()
	if err := s.(*volumeStore).be.(*thinBackend).check(context.Background()); err != nil {
		t.Fatalf("thin store check: %v", err)
	}
}

// WriteChunk is the most bytes the thin store s writes to its data files
// per pwrite (0: no bound): see onXFS.
func WriteChunk(s Store) int64 {
	if s.(*volumeStore).be.(*thinBackend).pool.xfs {
		return 0
	}
	return writeChunk
}

// SetCommitChunk makes the thin store s commit at most n batch ops per
// transaction, releasing its metadata lock between them.
func SetCommitChunk(s Store, n int) {
	b := s.(*volumeStore).be.(*thinBackend)
	b.metaMu.Lock()
	b.commitChunk = n
	b.metaMu.Unlock()
}

// DisableRecordCache makes the thin store s decode every volume record it
// reads and load its snapshots.
func DisableRecordCache(s Store) {
	c := &s.(*volumeStore).be.(*thinBackend).recs
	c.mu.Lock()
	c.off = true
	clear(c.m)
	c.mu.Unlock()
}

// SetViewWindowFrom makes the thin store s resolve a snapshot's view a
// window of clusters at a time from n snapshots on (n = 1: always).
func SetViewWindowFrom(s Store, n int) {
	s.(*volumeStore).be.(*thinBackend).viewFrom.Store(int64(n))
}

// FailRawSyncOnce makes the next fdatasync of a raw volume of the thin
// store s fail with err, as a device's write error would.
func FailRawSyncOnce(s Store, err error) {
	var once atomic.Bool
	SetRawSyncHook(s, func() error {
		if once.CompareAndSwap(false, true) {
			return err
		}
		return nil
	})
}

// SetRawSyncHook makes fn run before each fdatasync of a raw volume of the
// thin store s; an error from fn fails the fdatasync.
func SetRawSyncHook(s Store, fn func() error) {
	s.(*volumeStore).be.(*thinBackend).rawSyncHook.Store(&fn)
}

// FailMetaSyncOnce makes the next sync of the thin store s's metadata
// database fail with err.
func FailMetaSyncOnce(s Store, err error) {
	var once atomic.Bool
	fn := func() error {
		if once.CompareAndSwap(false, true) {
			return err
		}
		return nil
	}
	s.(*volumeStore).be.(*thinBackend).syncMetaHook.Store(&fn)
}

// SmallDataFiles returns o with data files of n bytes (a multiple of the
// cluster size) in place of 1 TiB, so that a test's clusters spread over
// several files.
func SmallDataFiles(o ThinOptions, n int64) ThinOptions {
	o.dataFileBytes = n
	return o
}

// SetDataDirSyncHook makes fn run before each fsync of the thin store s's
// data file directory; an error from fn fails that fsync.
func SetDataDirSyncHook(s Store, fn func() error) {
	s.(*volumeStore).be.(*thinBackend).pool.dirSyncHook.Store(&fn)
}
