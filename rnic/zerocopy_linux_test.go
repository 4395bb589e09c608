//go:build linux

package rnic

import (
	"net"
	"syscall"
	"testing"
)

// BenchmarkTCPStreamZerocopy is BenchmarkTCPStream with MSG_ZEROCOPY
// (SO_ZEROCOPY, completions reaped from the error queue), the engine's
// alternative to copying a batch into the socket. To a local socket the
// kernel copies the data anyway and adds the completion notifications: on
// loopback it costs about twice the CPU per byte of a plain write, so the
// transmitter does not use it.
func BenchmarkTCPStreamZerocopy(b *testing.B) {
	const (
		size        = 64 << 10
		soZerocopy  = 60        // SO_ZEROCOPY
		msgZerocopy = 0x4000000 // MSG_ZEROCOPY
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	notif, oob := make([]byte, 64), make([]byte, 256)
	var serr error
	b.SetBytes(size)
	b.ResetTimer()
	raw.Control(func(fd uintptr) {
		if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soZerocopy, 1); serr != nil {
			return
		}
		if serr = syscall.SetNonblock(int(fd), false); serr != nil {
			return
		}
		pending := 0
		for i := 0; i < b.N; i++ {
			for off := 0; off < size; {
				n, err := syscall.SendmsgN(int(fd), buf[off:], nil, nil, msgZerocopy)
				if err != nil {
					serr = err
					return
				}
				off += n
				pending++
			}
			for pending > 0 {
				if _, _, _, _, err := syscall.Recvmsg(int(fd), notif, oob, syscall.MSG_ERRQUEUE|syscall.MSG_DONTWAIT); err != nil {
					break
				}
				pending--
			}
		}
	})
	if serr != nil {
		b.Skipf("MSG_ZEROCOPY: %v", serr)
	}
	c.(*net.TCPConn).CloseWrite()
	<-done
	c.Close()
}
