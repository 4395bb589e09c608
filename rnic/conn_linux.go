//go:build linux

package rnic

import (
	"encoding/binary"
	"net"
	"syscall"
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
