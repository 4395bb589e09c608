package store

import (
	"errors"

	"golang.org/x/sys/unix"
)

// The data files' writes, and raw volumes' (raw.go), are made through the
// Go scheduler (unix.Pwrite), never with syscall.RawSyscall as the reads
// of cached data are (pread.go): a buffered write can wait in the kernel
// for as long as something else decides. A frozen file system (fsfreeze,
// which backup tools and VM snapshot agents use) holds it until the
// thaw; a device that stopped answering holds it in dirty-page throttling.
// A raw call keeps its P all that time, and the next garbage collection,
// which stops every P, waits for it with every goroutine of the process:
// rtarget answered no signal, no health check and no read until the thaw
// (TestWriteOnFrozenFSLeavesTheProcessRunning). Reads do not meet that:
// RWF_NOWAIT returns at once where they would wait, and the access-time
// update of a read never waits for a frozen file system.
//
// Measured before this was found (bench/README.md, "Writes without the
// scheduler"): raw 4 KiB writes, made only when no other write of ours was
// under way on the file, cut rtarget's CPU per write from 21.2-22.6 to
// 13.0-16.8 us through rinit (randwrite-4k-qd16 on a volume written in
// full: 23.3-24.1k -> 22.3-30.5k IOPS). That gain is given back: no test
// a raw write could make first (fsfreeze state, a device's health) says
// that it will not wait; pwritev2 with RWF_NOWAIT is none either, since
// vfs_writev waits for a frozen file system before it looks at the flag
// (on ext4 and XFS alike, bench/README.md). An io_uring, whose submission
// holds no P, does not win it back on ext4: it hands each buffered write
// to a kernel worker thread, and served a third of the writes; nor on
// XFS, which makes the write inside io_uring_enter (bench/README.md,
// "Writes through an io_uring").

// fallocate is unix.Fallocate, retried on EINTR (each mode the store uses
// can be made again: an allocation, a hole punch, a zeroed range).
func fallocate(fd int, mode uint32, pos, n int64) error {
	for {
		err := unix.Fallocate(fd, mode, pos, n)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// fallocate is the package's fallocate on data file f.
func (f *dataFile) fallocate(mode uint32, pos, n int64) error { return fallocate(f.fd, mode, pos, n) }
