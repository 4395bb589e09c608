// Package sockio makes the system calls of the data path's sockets: the
// reads and writes of the iWARP streams (rnic) and of the NBD export
// (initiator/nbd), on non-blocking sockets whose waiting is done by Go's
// network poller (syscall.RawConn).
//
// On Linux they go through syscall.RawSyscall, not syscall.Syscall, where
// that measured faster. Syscall tells the scheduler that the goroutine
// enters a system call; when every P of the process was idle (one I/O at
// a time, as at queue depth 1), that wakes the runtime's sysmon thread,
// which then sleeps and wakes in 20 µs steps until the process is idle
// again: two or three more context switches per I/O in each process, each
// a costly one in a VM. A non-blocking read or write returns at once
// (EAGAIN when it cannot proceed), so it need not hand its P over.
//
// Writes above RawWriteMax still go through Syscall. On loopback, a write
// runs the receiver's TCP processing inside the system call; RawSyscall
// holds the P through all of it, and with writes of any size 4 KiB reads
// at queue depth 16 through rinit measured 10 % slower. Reads copy only.
//
// With the race detector, Read and Write use the syscall package's
// wrappers: those tell the detector of the order the kernel makes between
// a write and the read that sees its bytes, which a raw system call
// cannot. Readv and Writev add a wrapper's read or write of no bytes for
// the same effect.
package sockio

import "syscall"

func errno(n int, err error) (int, syscall.Errno) {
	if err != nil {
		e, _ := err.(syscall.Errno)
		if e == 0 {
			e = syscall.EIO
		}
		return 0, e
	}
	return n, 0
}

// RawWriteMax is the most bytes a write moves through RawSyscall.
const RawWriteMax = 16 << 10
