package blockproto

import (
	"errors"
	"fmt"
)

// Decode error kinds. Every decoder failure is a *DecodeError whose Kind is
// one of these; match with errors.Is(err, ErrShort) and so on.
var (
	ErrShort    = errors.New("blockproto: message too short")
	ErrLength   = errors.New("blockproto: bad message length")
	ErrVersion  = errors.New("blockproto: unsupported protocol version")
	ErrOpcode   = errors.New("blockproto: unexpected opcode")
	ErrFlags    = errors.New("blockproto: unknown flags")
	ErrReserved = errors.New("blockproto: reserved field not zero")
	ErrField    = errors.New("blockproto: invalid field value")
)

// DecodeError is a message that failed to decode.
type DecodeError struct {
	Kind   error // one of the Err* values above
	Detail string
}

func (e *DecodeError) Error() string { return e.Kind.Error() + ": " + e.Detail }

// Unwrap returns the kind.
func (e *DecodeError) Unwrap() error { return e.Kind }

func errorf(kind error, format string, a ...any) error {
	return &DecodeError{Kind: kind, Detail: fmt.Sprintf(format, a...)}
}
