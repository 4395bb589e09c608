//go:build ceph

package rbd

import (
	"errors"
	"fmt"
	"syscall"
)

// EBLOCKLISTED is the errno librados returns to a blocklisted client
// (ESHUTDOWN on Linux).
const EBLOCKLISTED = syscall.ESHUTDOWN

// Sentinel errors an *Error unwraps to; test with errors.Is.
var (
	// ErrFenced: this client is blocklisted (another client broke its
	// exclusive lock); nothing it writes reaches the cluster any more.
	ErrFenced = errors.New("rbd: fenced (client blocklisted)")
	// ErrLockLost: another client owns the image's exclusive lock.
	ErrLockLost = errors.New("rbd: exclusive lock owned by another client")
	// ErrTimeout: the cluster did not answer within the configured timeout
	// (a full cluster, or no OSD or monitor reachable).
	ErrTimeout = errors.New("rbd: cluster timeout")
	// ErrNotFound: no such pool, namespace, image or snapshot.
	ErrNotFound = errors.New("rbd: not found")
	// ErrExists: the name is taken.
	ErrExists = errors.New("rbd: already exists")
	// ErrBusy: the image is open elsewhere (it has watchers) or has
	// children.
	ErrBusy = errors.New("rbd: busy")
)

// Error is a failed librbd or librados call.
type Error struct {
	Op    string // "write", "lock acquire", "metadata get", ...
	Image string // "pool/ns/image", or "" for pool-level calls
	Errno syscall.Errno
	Err   error // the sentinel the errno maps to, or nil
}

func (e *Error) Error() string {
	where := ""
	if e.Image != "" {
		where = " " + e.Image
	}
	return fmt.Sprintf("rbd %s%s: %v (errno %d)", e.Op, where, e.Errno.Error(), int(e.Errno))
}

// Unwrap returns the sentinel (if any) and the errno.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Err, e.Errno}
	}
	return []error{e.Errno}
}

// errnoOf extracts the errno of an error returned by go-ceph: its errors
// carry it as ErrorCode() (negative), or are the package's ErrNotFound.
func errnoOf(err error) (syscall.Errno, bool) {
	var coded interface{ ErrorCode() int }
	if errors.As(err, &coded) {
		c := coded.ErrorCode()
		if c < 0 {
			c = -c
		}
		return syscall.Errno(c), true
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en, true
	}
	return 0, false
}

// sentinel maps an errno to this package's sentinel error.
func sentinel(en syscall.Errno) error {
	switch en {
	case syscall.ESHUTDOWN:
		return ErrFenced
	case syscall.EROFS:
		return ErrLockLost
	case syscall.ETIMEDOUT:
		return ErrTimeout
	case syscall.ENOENT:
		return ErrNotFound
	case syscall.EEXIST:
		return ErrExists
	case syscall.EBUSY, syscall.ENOTEMPTY:
		return ErrBusy
	}
	return nil
}

// wrap turns an error of go-ceph into an *Error; nil stays nil. An error
// that carries no errno is wrapped with the operation's context as it is.
func wrap(op, image string, err error) error {
	if err == nil {
		return nil
	}
	en, ok := errnoOf(err)
	if !ok {
		if image != "" {
			return fmt.Errorf("rbd %s %s: %w", op, image, err)
		}
		return fmt.Errorf("rbd %s: %w", op, err)
	}
	return &Error{Op: op, Image: image, Errno: en, Err: sentinel(en)}
}

// errnoErr is wrap for a raw negative return value.
func errnoErr(op, image string, ret int) error {
	if ret >= 0 {
		return nil
	}
	en := syscall.Errno(-ret)
	return &Error{Op: op, Image: image, Errno: en, Err: sentinel(en)}
}
