//go:build !linux

package sockio

import (
	"syscall"
	"unsafe"
)

// Read reads into p from the non-blocking socket fd.
func Read(fd uintptr, p []byte) (int, syscall.Errno) { return errno(syscall.Read(int(fd), p)) }

// Write writes p to the non-blocking socket fd.
func Write(fd uintptr, p []byte) (int, syscall.Errno) { return errno(syscall.Write(int(fd), p)) }

// Writev writes the buffers of iov to the non-blocking socket fd.
func Writev(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	r, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// Readv reads into the buffers of iov from the non-blocking socket fd.
func Readv(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	r, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}
