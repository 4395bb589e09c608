//go:build linux

package rnic

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// tcpClose is the kernel's TCP_CLOSE state (tcpi_state in TCP_INFO).
const tcpClose = 7

// peerReset reports whether the kernel closed nc's connection because a
// reset arrived: a read then returns EOF, not ECONNRESET, when another
// system call (the transmitter's write) consumed the reset's error. After a
// FIN the state is CLOSE_WAIT instead.
func peerReset(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var state byte
	raw.Control(func(fd uintptr) {
		// The first byte of struct tcp_info is tcpi_state.
		if v, err := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO); err == nil {
			var b [4]byte
			binary.NativeEndian.PutUint32(b[:], uint32(v))
			state = b[0]
		}
	})
	return state == tcpClose
}

// vecRead is the receiver's readv(2) through the netpoller: fn is made
// once, since a closure per read would allocate, and leaves its result in
// n and errno.
type vecRead struct {
	iov   [2]syscall.Iovec
	cnt   int
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// readVec reads into a, then b, with one readv: what is available, at
// least one byte, or io.EOF at the end of the stream.
func (c *conn) readVec(a, b []byte) (int, error) {
	if c.raw == nil || len(a) == 0 {
		return c.nc.Read(a)
	}
	v := &c.rxv
	if v.fn == nil {
		v.fn = func(fd uintptr) bool {
			for {
				r, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(v.cnt))
				switch e {
				case syscall.EINTR:
					continue
				case syscall.EAGAIN:
					return false // wait until readable
				}
				v.n, v.errno = int(r), e
				return true
			}
		}
	}
	v.iov[0].Base = &a[0]
	v.iov[0].SetLen(len(a))
	v.cnt = 1
	if len(b) > 0 {
		v.iov[1].Base = &b[0]
		v.iov[1].SetLen(len(b))
		v.cnt = 2
	}
	err := c.raw.Read(v.fn)
	v.iov = [2]syscall.Iovec{} // hold no memory between reads
	switch {
	case err != nil:
		return 0, err
	case v.errno != 0:
		return 0, os.NewSyscallError("readv", v.errno)
	case v.n == 0:
		return 0, io.EOF
	}
	if raceEnabled {
		raceWrite(a[:min(v.n, len(a))])
	}
	return v.n, nil
}
