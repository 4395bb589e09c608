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
// That holds under load too, for writes of any size. At queue depth 16 the
// transmitters' batches and rinit's NBD replies pass 16 KiB, and writes
// that large went through Syscall once: on loopback a write runs the
// receiver's TCP processing inside the call, and RawSyscall holds the P
// through all of it (on the host of the time, 4 KiB random reads at queue
// depth 16 measured 10 % slower with every write raw). On a host where a
// system call costs about 1.4 µs (an AMD EPYC guest), perf then put 31 %
// of rtarget's samples and 19 % of rinit's in sysmon at that depth, woken
// by those writes each time the process had gone idle; with every write
// raw, none, and rtarget made half the context switches per I/O (0.27 ->
// 0.12). Interleaved through rinit (memory store, 3-5 repetitions per
// run), raw writes against the bound, in four runs: randread-4k-qd16
// 0.95x, 1.17x, 1.43x and 1.07x the IOPS; randwrite-4k-qd16 0.91x,
// 1.17x and 0.99x; 1 MiB sequential reads and writes 1.04x and 0.99x,
// 1.08x and 1.03x, with 5-6 % less CPU per I/O in the second run.
//
// With the race detector, Read and Write use the syscall package's
// wrappers: those tell the detector of the order the kernel makes between
// a write and the read that sees its bytes, which a raw system call
// cannot. Readv and Writev add a wrapper's read or write of no bytes for
// the same effect.
package sockio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

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

// Ready reports whether a read of the socket fd would return at once:
// bytes are there, the stream ended, or the socket has an error. It asks
// poll(2) with no timeout, which consumes nothing: a recv, even with
// MSG_PEEK, would take the socket's pending error (a reset) away from
// the read that follows, which would then see only the end of the stream.
func Ready(fd uintptr) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds[:], 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return true // the read reports what is wrong
		}
		return n > 0
	}
}
