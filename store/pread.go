package store

import (
	"errors"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The data files' reads. Data in the page cache is read with preadv2 and
// RWF_NOWAIT, which never waits for the device (a miss only starts the
// read of what is missing, for the Pread that follows); such a call is made
// without telling the Go scheduler (syscall.RawSyscall6), since a
// scheduler-visible system call costs its entry and exit and, when the
// process had gone idle, wakes the runtime's monitor thread (sysmon):
// through rinit, 4 KiB random reads at QD1 on a thin volume 6.3-7.5k ->
// 8.6-9.8k IOPS, and rtarget's CPU at QD16 down 15 %. Only what the page
// cache does not hold goes through unix.Pread, which may wait. A frozen
// file system does not hold a raw read either: its access-time update only
// tries to take the write lock the freeze holds
// (TestReadOnFrozenFSReturns). Writes have no such test (ext4 offers no
// RWF_NOWAIT for buffered writes), and stay scheduler-visible (pwrite.go
// says why).

// rawReadMax bounds the reads made raw: a raw call keeps its P while the
// kernel copies, and for large reads the system call's cost is small next
// to the copy (1 MiB reads through rinit measured 10 % slower raw).
const rawReadMax = 64 << 10

// pread fills dst from fd at pos, with zeros past the end of the file.
func pread(fd int, dst []byte, pos int64) error {
	if len(dst) <= rawReadMax {
		if n, err := preadv2NoWait(fd, dst, pos); err == nil {
			if n == 0 {
				clear(dst) // past the end of the file
				return nil
			}
			dst, pos = dst[n:], pos+int64(n)
		}
	}
	for len(dst) > 0 {
		n, err := unix.Pread(fd, dst, pos)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			clear(dst)
			return nil
		}
		dst, pos = dst[n:], pos+int64(n)
	}
	return nil
}

// preadNoWait fills dst from fd at pos if the page cache holds all of it,
// and reports whether it did.
func preadNoWait(fd int, dst []byte, pos int64) bool {
	n, err := preadv2NoWait(fd, dst, pos)
	switch {
	case err == nil && n == len(dst):
		return true
	case err == nil && n == 0:
		clear(dst) // past the end of the file
		return true
	}
	return false
}

// preadv2NoWait is preadv2(fd, {dst}, pos, RWF_NOWAIT) made with
// syscall.RawSyscall6: what the page cache holds of dst from its start,
// or EAGAIN. Under the race detector it goes through unix.Preadv2, whose
// wrapper tells the detector that dst was written.
func preadv2NoWait(fd int, dst []byte, pos int64) (int, error) {
	if raceEnabled || len(dst) == 0 {
		return unix.Preadv2(fd, [][]byte{dst}, pos, unix.RWF_NOWAIT)
	}
	iov := syscall.Iovec{Base: unsafe.SliceData(dst)}
	iov.SetLen(len(dst))
	// The offset goes as two halves of a register's width (on 64-bit
	// Linux the high one is 0).
	const bits = 8 * unsafe.Sizeof(uintptr(0))
	lo, hi := uintptr(pos), uintptr(uint64(pos)>>(bits-1)>>1)
	r, _, e := syscall.RawSyscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1,
		lo, hi, unix.RWF_NOWAIT)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
