//go:build !linux

package nbd

import "syscall"

// watchShut does nothing elsewhere: POLLRDHUP, which tells a peer that
// shut its side down while bytes it sent are still unread, is Linux's. A
// client that leaves while the reader waits is then noticed once the wait
// ends.
func watchShut(raw syscall.RawConn, done <-chan struct{}, shut func()) {}
