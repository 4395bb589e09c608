package store

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// CrashChild runs the test named name of this test binary in a child
// process, with the environment variable env set to dir, and fails t unless
// the child reached CrashNow (the child's test skips itself when env is
// unset: it runs only as a child).
func CrashChild(t *testing.T, name, env, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "CHILD-READY") {
		t.Fatalf("child:\n%s", out)
	}
}

// CrashChildStore opens, in a child of CrashChild, the thin store in the
// directory env names, committing only when asked (a flush, a close); the
// test skips itself when env is unset (not a child).
func CrashChildStore(t *testing.T, env string) Store {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		t.Skip("runs only as the child process of another test")
	}
	s, err := OpenThin(dir, ThinOptions{CommitInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// CrashNow tells CrashChild that the child got where it meant to, then
// kills the process as a crash would (SIGKILL: no deferred call runs).
func CrashNow() {
	fmt.Println("CHILD-READY")
	os.Stdout.Sync()
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

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
