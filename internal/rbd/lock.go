//go:build ceph

package rbd

import (
	"errors"
	"fmt"

	"github.com/ceph/go-ceph/rbd"
)

// The exclusive lock taken with AcquireLock is librbd's managed lock in
// its explicit form (rbd_lock_acquire): the owner keeps it when another
// client asks for it, so the other client's writes fail with ErrLockLost.
// Breaking it (TakeOverLock) blocklists the owner's client instance in the
// OSD map: from then on every operation of the old owner fails with
// ErrFenced, including writes it had in flight.

// LockOwners returns the clients owning the image's exclusive lock, as
// librbd names them ("client.N ..."), or nil when nobody holds it.
func (im *Image) LockOwners() ([]string, error) {
	owners, err := im.img.LockGetOwners()
	if err != nil {
		return nil, wrap("lock owners", im.where, err)
	}
	var out []string
	for _, o := range owners {
		out = append(out, o.Owner)
	}
	return out, nil
}

// AcquireLock takes the exclusive lock. It fails with ErrLockLost (or
// ErrBusy) while another client owns it.
func (im *Image) AcquireLock() error {
	err := wrap("lock acquire", im.where, im.img.LockAcquire(rbd.LockModeExclusive))
	if err == nil {
		return im.checkOwner()
	}
	return err
}

// checkOwner confirms that this handle owns the lock: rbd_lock_acquire
// can return 0 while the owner refused to hand the lock over.
func (im *Image) checkOwner() error {
	ok, err := im.IsLockOwner()
	if err != nil {
		return err
	}
	if !ok {
		return &Error{Op: "lock acquire", Image: im.where, Errno: 30, Err: ErrLockLost}
	}
	return nil
}

// TakeOverLock takes the exclusive lock, breaking another owner's lock
// first if there is one. Breaking blocklists the old owner: it can no
// longer write (ErrFenced). It returns the owners it broke. An owner is
// broken without asking it first: it may be dead (kill -9) with its watch
// still registered, and asking would wait for librbd's request timeout.
func (im *Image) TakeOverLock() (broken []string, err error) {
	// A few rounds: the owner may change between the look and the break
	// (a third gateway taking over at the same moment).
	for range 3 {
		owners, err := im.LockOwners()
		if err != nil {
			return broken, err
		}
		for _, o := range owners {
			err := wrap("lock break "+o, im.where, im.img.LockBreak(rbd.LockModeExclusive, o))
			if err != nil && !errors.Is(err, ErrNotFound) {
				return broken, err
			}
			broken = append(broken, o)
		}
		err = im.AcquireLock()
		if err == nil {
			return broken, nil
		}
		if !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrBusy) {
			return broken, err
		}
	}
	return broken, fmt.Errorf("rbd %s: lock taken by another client again while taking it over: %w", im.where, ErrLockLost)
}

// IsLockOwner reports whether this handle owns the exclusive lock.
func (im *Image) IsLockOwner() (bool, error) {
	ok, err := im.img.LockIsExclusiveOwner()
	return ok, wrap("lock owner", im.where, err)
}

// ReleaseLock releases the exclusive lock.
func (im *Image) ReleaseLock() error {
	return wrap("lock release", im.where, im.img.LockRelease())
}
