package store

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors returned (wrapped) by this package; test with errors.Is.
var (
	ErrNotFound   = errors.New("not found")
	ErrExists     = errors.New("already exists")
	ErrBusy       = errors.New("volume is busy")
	ErrOutOfRange = errors.New("block range out of volume bounds")
	ErrChecksum   = errors.New("stored block failed checksum")
	ErrClosed     = errors.New("closed")
	ErrInvalid    = errors.New("invalid argument")
	ErrLocked     = errors.New("data directory in use by another store")
	ErrCorrupt    = errors.New("store metadata corrupt")
	// ErrNotSupported: the backend or the volume's kind cannot do this
	// (snapshots of a raw volume, for instance).
	ErrNotSupported = errors.New("not supported")
	// ErrHasDependents: a snapshot has clones, or a volume has snapshots
	// with clones.
	ErrHasDependents = errors.New("has dependent clones")
	// ErrReadOnly: a write to a snapshot handle.
	ErrReadOnly = errors.New("read-only")
	// ErrNoSpace: the write needs space the store does not have (a thin
	// store whose file system is down to its reserve, see ThinOptions).
	ErrNoSpace = errors.New("no space left in the store")
	// ErrShrink: GrowVolume was given a size below the volume's.
	ErrShrink = errors.New("size below the volume's")
)

// OpError is the error of a block operation on a volume. It names the
// operation, the volume and the block range; Err holds the cause.
type OpError struct {
	Op     string // "read", "write", "flush", "trim", "write-zeroes", "write-zeroes-allocated", "block-status"
	Volume string
	LBA    uint64
	Count  uint64 // blocks
	Err    error
}

func (e *OpError) Error() string {
	return fmt.Sprintf("store: %s volume %q lba %d count %d: %v", e.Op, e.Volume, e.LBA, e.Count, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// noSpace marks a write's ENOSPC or EDQUOT (a sparse file on a full file
// system) as ErrNoSpace, keeping the errno.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

// blockError reports that block lba is the cause of err.
func blockError(lba uint64, err error) error {
	return fmt.Errorf("block %d: %w", lba, err)
}
