package initiator

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rnic-dev/rnic/blockproto"
)

// Errors of this package; test with errors.Is.
var (
	ErrClosed     = errors.New("initiator: client closed")
	ErrAuth       = errors.New("initiator: authentication failed")
	ErrInvalid    = errors.New("initiator: invalid request")
	ErrRange      = errors.New("initiator: beyond the end of the volume")
	ErrNoSpace    = errors.New("initiator: the target's store has no space left")
	ErrReadOnly   = errors.New("initiator: volume is read-only")
	ErrReserved   = errors.New("initiator: volume reserved by another initiator")
	ErrStaleToken = errors.New("initiator: stale fencing token")
	ErrLocked     = errors.New("initiator: lock held by another initiator")
	ErrLockLost   = errors.New("initiator: lock lost (its session ended)")
	ErrNoSlot     = errors.New("initiator: session has no reservation slot")
	// ErrWritesLost is returned by Flush when the target restarted without
	// a clean shutdown since the last successful flush: writes it had
	// acknowledged may not have reached its disk.
	ErrWritesLost = errors.New("initiator: target restarted; writes acknowledged since the last flush may be lost")
	// ErrTimeout: the target answered no heartbeat in time; the session
	// was dropped (and is re-established, at the next target if any).
	ErrTimeout = errors.New("initiator: target not responding")
	// ErrProtocol: the target violated the block protocol.
	ErrProtocol = errors.New("initiator: protocol violation by the target")

	// errConnLost marks failures that a new session may retry.
	errConnLost = errors.New("initiator: connection lost")
)

// StatusError is a command the target answered with a status other than
// OK.
type StatusError struct {
	Op     blockproto.Opcode
	Status blockproto.Status
	Detail string
}

func (e *StatusError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("initiator: %s: %s: %s", e.Op, e.Status, e.Detail)
	}
	return fmt.Sprintf("initiator: %s: %s", e.Op, e.Status)
}

// Unwrap returns the package error and the errno the status stands for.
func (e *StatusError) Unwrap() []error {
	switch e.Status {
	case blockproto.StatusInvalid, blockproto.StatusTooLarge:
		return []error{ErrInvalid, syscall.EINVAL}
	case blockproto.StatusRange:
		return []error{ErrRange, syscall.ENOSPC}
	case blockproto.StatusNoSpace:
		return []error{ErrNoSpace, syscall.ENOSPC}
	case blockproto.StatusReadOnly:
		return []error{ErrReadOnly, syscall.EROFS}
	case blockproto.StatusStaleToken:
		return []error{ErrStaleToken, syscall.EPERM}
	case blockproto.StatusShutdown:
		return []error{errConnLost}
	case blockproto.StatusAuth:
		return []error{ErrAuth, syscall.EACCES}
	}
	return []error{syscall.EIO}
}

// ReservedError says who holds the reservation that refused a write or a
// Reserve.
type ReservedError struct {
	Holder    string // the holder's initiator name ("" if it left meanwhile)
	Exclusive bool
	Word      uint64 // the reservation word seen
}

func (e *ReservedError) Error() string {
	mode := "shared"
	if e.Exclusive {
		mode = "exclusively"
	}
	if e.Holder == "" {
		return fmt.Sprintf("initiator: volume reserved (%s, word %#x)", mode, e.Word)
	}
	return fmt.Sprintf("initiator: volume reserved %s by initiator %s", mode, e.Holder)
}

// Unwrap makes the error match ErrReserved and EPERM.
func (e *ReservedError) Unwrap() []error { return []error{ErrReserved, syscall.EPERM} }

// LockedError says who holds a numbered lock.
type LockedError struct {
	Lock   uint32
	Holder string
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("initiator: lock %d held by initiator %s", e.Lock, e.Holder)
}

// Unwrap makes the error match ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// statusErr converts a non-OK answer to an error.
func statusErr(op blockproto.Opcode, st blockproto.Status, value uint64, detail string) error {
	if st == blockproto.StatusOK {
		return nil
	}
	if st == blockproto.StatusReserved {
		return &ReservedError{Holder: detail, Exclusive: blockproto.Reservation(value).IsExclusive(), Word: value}
	}
	return &StatusError{Op: op, Status: st, Detail: detail}
}
