// Package rbd is the thin layer of the rbd store backend over librbd and
// librados (github.com/ceph/go-ceph): a connection configured so that a
// full or unreachable cluster gives an error instead of a hang, images
// opened for block I/O with the semantics the store needs (flush reaches
// every replica, discard and write-zeroes really zero), image metadata,
// snapshots and clones, and the exclusive lock with the blocklist fencing
// that gateway failover relies on.
//
// Every file but this one needs the build tag ceph (and pacific against
// Ceph 16, Debian 12's librbd); without it the package is empty and the
// module builds pure Go.
//
// # Errors
//
// librbd returns negative errno values. This package wraps them as
// *Error, which names the operation and the image and unwraps to the
// syscall.Errno and to one of the sentinel errors below where one applies:
// ErrFenced (ESHUTDOWN or EBLOCKLISTED: this client was blocklisted, the
// lock was broken by another gateway), ErrLockLost (EROFS: another client
// owns the exclusive lock), ErrTimeout (ETIMEDOUT: the cluster did not
// answer within the configured timeout).
package rbd
