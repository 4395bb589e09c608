//go:build linux

package nbd

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// watchShut calls shut once the peer of raw's socket has shut its sending
// side down (a FIN: POLLRDHUP) or the connection failed (a reset: POLLHUP,
// POLLERR), unless done is closed first. POLLRDHUP is set once the FIN has
// arrived, also while the bytes sent before it are still unread, which is
// what tells a client that left from one that merely sent more than the
// reader has taken. It polls a duplicate of the socket, in steps of
// peerPoll, so that closing the connection meanwhile does not wait for
// the watch; the duplicate is closed within a step of done.
func watchShut(raw syscall.RawConn, done <-chan struct{}, shut func()) {
	fd := -1
	if err := raw.Control(func(s uintptr) { fd, _ = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
		return // closed, or out of descriptors: no watch, the wait ends as it would have
	}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for {
			select {
			case <-done:
				return
			default:
			}
			n, err := unix.Poll(fds, peerPoll)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				return
			case n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0:
				shut()
				return
			}
		}
	}()
}
