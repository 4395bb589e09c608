//go:build ceph

package rbd

import (
	"fmt"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// Image is an open image. Its methods may be called from many goroutines
// at once (librbd's image handle is thread-safe); Close must not overlap
// any of them.
type Image struct {
	img      *rbd.Image
	pool     *Pool
	name     string
	where    string
	readOnly bool
}

// Name is the image's name.
func (im *Image) Name() string { return im.name }

// Close closes the image (releasing its exclusive lock if held).
func (im *Image) Close() error { return wrap("close", im.where, im.img.Close()) }

// Size is the image's current size in bytes.
func (im *Image) Size() (uint64, error) {
	s, err := im.img.GetSize()
	return s, wrap("size", im.where, err)
}

// Created is the image's creation time.
func (im *Image) Created() (time.Time, error) {
	ts, err := im.img.GetCreateTimestamp()
	if err != nil {
		return time.Time{}, wrap("create timestamp", im.where, err)
	}
	return time.Unix(ts.Sec, ts.Nsec).UTC(), nil
}

// ID is the image's id within its pool (stable, never reused while the
// image exists).
func (im *Image) ID() (string, error) {
	id, err := im.img.GetId()
	return id, wrap("id", im.where, err)
}

// ReadAt fills p from offset off. The range must lie inside the image.
// Reads, writes, discards and flushes go through librbd's asynchronous
// interface on the image's handle (see aio), waited for on a channel.
func (im *Image) ReadAt(p []byte, off int64) error {
	n, err := im.aio(0, p, uint64(off), uint64(len(p)))
	if err == nil && n != len(p) {
		return fmt.Errorf("rbd read %s: %d of %d bytes at %d", im.where, n, len(p), off)
	}
	return err
}

// WriteAt writes p at offset off. Without the exclusive lock (another
// client owns it) it fails with ErrLockLost; once this client has been
// blocklisted, with ErrFenced.
func (im *Image) WriteAt(p []byte, off int64) error {
	_, err := im.aio(1, p, uint64(off), uint64(len(p)))
	return err
}

// Discard deallocates [off, off+n): with the settings of this package it
// reads as zeros afterwards, whole objects being removed and parts of
// objects zeroed (in a clone, hiding the parent's data).
func (im *Image) Discard(off, n uint64) error {
	_, err := im.aio(2, nil, off, n)
	return err
}

// zeroBlock is the pattern WriteZeroes repeats.
var zeroBlock = make([]byte, 4096)

// WriteZeroes sets [off, off+n) to zeros; n is a multiple of 4096. librbd
// turns a write-same of zeros into a discard where it can
// (rbd_discard_on_zeroed_write_same) and writes zeros where it cannot.
func (im *Image) WriteZeroes(off, n uint64) error {
	_, err := im.img.WriteSame(off, n, zeroBlock, rados.OpFlagNone)
	return wrap("write-zeroes", im.where, err)
}

// Flush waits until every write acknowledged so far is on every replica
// (with rbd_cache off it already is: this also orders against librbd's
// internal queues).
func (im *Image) Flush() error {
	_, err := im.aio(3, nil, 0, 0)
	return err
}

// Resize changes the image's size; shrinking discards the tail.
func (im *Image) Resize(size uint64) error {
	return wrap("resize", im.where, im.img.Resize2(size, true, func(_, _ uint64, _ interface{}) int { return 0 }, nil))
}

// Flatten copies the parent's data into a clone, detaching it from its
// parent snapshot.
func (im *Image) Flatten() error { return wrap("flatten", im.where, im.img.Flatten()) }

// Extent is an allocated (or, for a diff, changed) range of an image.
type Extent struct {
	Offset, Length uint64
	Exists         bool // false: the range was discarded (reads as zeros)
}

// Allocated calls fn with the allocated extents in [off, off+n), in order;
// ranges never reported read as zeros (parent data of a clone counts as
// allocated). It uses the object map when the image has one.
func (im *Image) Allocated(off, n uint64, fn func(Extent) error) error {
	return im.diff("", off, n, rbd.IncludeParent, rbd.DisableWholeObject, fn)
}

// Diff calls fn with the extents of [off, off+n) that changed between
// snapshot from ("" = the image's creation) and what the image shows (its
// head, or the snapshot it was opened at), in order, the parent of a clone
// excluded. wholeObject reports whole objects from the object map (fast,
// RBD's "du" granularity); otherwise the extents are exact.
func (im *Image) Diff(from string, off, n uint64, wholeObject bool, fn func(Extent) error) error {
	whole := rbd.DisableWholeObject
	if wholeObject {
		whole = rbd.EnableWholeObject
	}
	return im.diff(from, off, n, rbd.ExcludeParent, whole, fn)
}

func (im *Image) diff(from string, off, n uint64, parent rbd.DiffIncludeParent, whole rbd.DiffWholeObject,
	fn func(Extent) error) error {
	var ferr error
	err := im.img.DiffIterate(rbd.DiffIterateConfig{
		SnapName:      from,
		Offset:        off,
		Length:        n,
		IncludeParent: parent,
		WholeObject:   whole,
		Callback: func(o, l uint64, exists int, _ interface{}) int {
			if ferr = fn(Extent{Offset: o, Length: l, Exists: exists != 0}); ferr != nil {
				return -1
			}
			return 0
		},
	})
	if ferr != nil {
		return ferr
	}
	return wrap("diff iterate", im.where, err)
}
