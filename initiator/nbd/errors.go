package nbd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Errors of this package; test with errors.Is.
var (
	// ErrProtocol: the peer violated the NBD protocol in a way that ends
	// the connection (bad magic, unknown client flags, a WRITE payload
	// longer than the server accepts, an unknown NBD_OPT_EXPORT_NAME).
	ErrProtocol = errors.New("nbd: protocol violation")
	// ErrMalformed: option data whose lengths do not add up. The server
	// answers such an option with NBD_REP_ERR_INVALID and carries on.
	ErrMalformed = errors.New("nbd: malformed option data")
	// ErrConfig: the Server or one of its Exports is misconfigured.
	ErrConfig = errors.New("nbd: invalid configuration")
	// ErrClientGone is the cause of the context of a connection's Backend
	// calls once its client left without NBD_CMD_DISC
	// (context.Cause): its requests still in flight are abandoned.
	ErrClientGone = errors.New("nbd: the client left without NBD_CMD_DISC")
)

// Error is a Backend error that carries the NBD error value to send to the
// client. Backends return it (possibly wrapped) when they know better than
// the default mapping; see Errno.
type Error struct {
	Errno uint32 // one of EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN
	Err   error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("nbd error %d", e.Errno)
	}
	return fmt.Sprintf("nbd error %d: %v", e.Errno, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errno maps a Backend error to the NBD error value sent in the reply:
//
//   - nil: 0.
//   - an *Error anywhere in the chain: its Errno, if it is a value the
//     protocol defines, else EIO.
//   - context.Canceled or context.DeadlineExceeded: ESHUTDOWN (the server
//     is going away; clients then disconnect softly). A Backend that times
//     out on its own should return an I/O error instead.
//   - syscall errors, matched with errors.Is: EPERM and EROFS -> EPERM;
//     ENOSPC, EDQUOT and EFBIG -> ENOSPC (as the specification asks);
//     EINVAL -> EINVAL; ENOMEM -> ENOMEM; EOVERFLOW -> EOVERFLOW;
//     ENOTSUP (EOPNOTSUPP) and errors.ErrUnsupported -> ENOTSUP;
//     ESHUTDOWN -> ESHUTDOWN.
//   - anything else: EIO.
func Errno(err error) uint32 {
	if err == nil {
		return 0
	}
	var ne *Error
	if errors.As(err, &ne) {
		switch ne.Errno {
		case EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN:
			return ne.Errno
		}
		return EIO
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ESHUTDOWN
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		return EPERM
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return ENOSPC
	case errors.Is(err, syscall.EINVAL):
		return EINVAL
	case errors.Is(err, syscall.ENOMEM):
		return ENOMEM
	case errors.Is(err, syscall.EOVERFLOW):
		return EOVERFLOW
	case errors.Is(err, syscall.ENOTSUP), errors.Is(err, errors.ErrUnsupported):
		return ENOTSUP
	case errors.Is(err, syscall.ESHUTDOWN):
		return ESHUTDOWN
	}
	return EIO
}
