//go:build linux

package sockio

import (
	"syscall"
	"unsafe"
)

// Read reads into p from the non-blocking socket fd: the bytes read, or
// the error number (EAGAIN: nothing to read now; 0 bytes and no error:
// the end of the stream).
func Read(fd uintptr, p []byte) (int, syscall.Errno) {
	if raceEnabled {
		return errno(syscall.Read(int(fd), p))
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// Readv reads into the buffers of iov from the non-blocking socket fd.
func Readv(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	if raceEnabled {
		syscall.Read(int(fd), nil) // reads nothing; the wrapper's acquire
	}
	return int(r), 0
}

// Write writes p to the non-blocking socket fd: the bytes the socket took,
// or the error number (EAGAIN: none now).
func Write(fd uintptr, p []byte) (int, syscall.Errno) {
	if raceEnabled {
		return errno(syscall.Write(int(fd), p))
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// Writev writes the buffers of iov to the non-blocking socket fd.
func Writev(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	if raceEnabled {
		syscall.Write(int(fd), nil) // writes nothing; the wrapper's release
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}
