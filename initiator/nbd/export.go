package nbd

import (
	"context"
	"fmt"
	"math/bits"
)

// Backend is the storage behind an export. The server calls its methods
// concurrently, from many requests of many connections, so they must be
// safe for concurrent use.
//
// Offsets and lengths are in bytes. The server has already checked that
// every range lies inside [0, Size()) and is aligned to the export's
// MinBlock, and that p is at most MaxBlock long; lengths passed to Trim and
// WriteZeroes may exceed MaxBlock (they carry no payload). Zero-length
// requests never reach the Backend.
//
// Errors are mapped to NBD error values by Errno; return an *Error to pick
// the value yourself. ctx is cancelled when the server shuts down.
type Backend interface {
	// Size is the export size in bytes. It is read once per connection,
	// when the client selects the export.
	Size() int64
	// ReadAt fills all of p with the bytes at off. p comes from a pool
	// and is not cleared: a nil error must mean every byte was written.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt writes p at off. With fua set the data must be durable
	// when WriteAt returns (NBD_CMD_FLAG_FUA).
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	// Flush makes every write that completed before Flush was called
	// durable (NBD_CMD_FLUSH).
	Flush(ctx context.Context) error
	// Trim discards the range (NBD_CMD_TRIM); it is a hint, and the range
	// may read back as anything until it is written again. A Backend that
	// cannot trim returns errors.ErrUnsupported, which the server answers
	// with success.
	Trim(ctx context.Context, off, length int64) error
	// WriteZeroes makes the range read back as zeroes
	// (NBD_CMD_WRITE_ZEROES); with fua set it must be durable on return.
	WriteZeroes(ctx context.Context, off, length int64, fua bool) error
}

// AsyncBackend is a Backend that can also start reads and writes without
// blocking. The server then runs READ and WRITE without a goroutine per
// request: it starts each from the connection's reader, and the backend
// reports the outcome through the request's Completion, exactly once,
// possibly before the Start call returns; Complete never blocks. The
// buffer belongs to the backend until then. Complete returns a Flusher
// (the connection's reply writer): the backend calls its Flush once the
// burst of completions it is delivering has ended, once per distinct
// Flusher (or right after Complete when it delivers no burst), and the
// replies of the burst leave in one write.
type AsyncBackend interface {
	Backend
	StartRead(ctx context.Context, p []byte, off int64, c Completion)
	StartWrite(ctx context.Context, p []byte, off int64, fua bool, c Completion)
}

// Completion and Flusher are aliases of interface literals, so that a
// backend's package can declare the identical types without importing
// this one.
type (
	Completion = interface {
		Complete(err error) Flusher
	}
	Flusher = interface{ Flush() }
)

// BlockStatuser is an optional Backend interface: the allocation of the
// export, for NBD_CMD_BLOCK_STATUS with the base:allocation metadata
// context, which the server offers only for exports whose Backend has it.
// BlockStatus reports length bytes at off (checked as for ReadAt) in
// order, as consecutive runs: fn gets each run's length and whether it is
// a hole (not allocated; it reads as zeros); fn returns false to stop.
type BlockStatuser interface {
	BlockStatus(ctx context.Context, off, length int64, fn func(n int64, hole bool) bool) error
}

// AllocatedZeroer is an optional Backend interface for
// NBD_CMD_WRITE_ZEROES with NBD_CMD_FLAG_NO_HOLE, which the specification
// says must leave the area fully provisioned (later writes there must not
// fail for lack of space): WriteZeroesAllocated makes the range read back
// as zeroes and keeps it allocated; with fua set it must be durable on
// return. For a Backend without it the server writes zeroes with WriteAt
// (and flushes for FUA), which allocates them as written data.
type AllocatedZeroer interface {
	WriteZeroesAllocated(ctx context.Context, off, length int64, fua bool) error
}

// LossCounter is an optional Backend interface, for a Backend whose Flush
// reports only once that writes it had acknowledged were lost since they
// were flushed last (a crash of the storage behind it, found out after
// the fact): WriteLosses counts the Flushes that reported such a loss. An
// NBD client whose writes were acknowledged before a loss was reported to
// another connection's FLUSH then gets EIO for its own next FLUSH too:
// its writes may be among those lost, and NBD_CMD_FLUSH may succeed only
// when the writes acknowledged to it are durable.
type LossCounter interface {
	WriteLosses() uint64
}

// Plugger is an optional Backend interface: Plug holds back the requests
// started from now on until Unplug is called on what it returns, so that
// requests read from the client in one burst reach the backend's transport
// together. The server unplugs before anything it does can wait.
type Plugger interface {
	Plug() Unplugger
}

// Unplugger ends a Plug (an alias, like Completion).
type Unplugger = interface{ Unplug() }

// Export is one named volume the server offers.
type Export struct {
	// Name is the export name clients ask for. The empty name is the
	// default export: a client asking for "" gets the export named "" if
	// there is one, else the first export.
	Name string
	// Description is shown to humans (NBD_OPT_LIST, NBD_INFO_DESCRIPTION).
	Description string
	Backend     Backend
	// ReadOnly exports advertise NBD_FLAG_READ_ONLY and refuse WRITE,
	// TRIM and WRITE_ZEROES with EPERM.
	ReadOnly bool
	// MultiConn advertises NBD_FLAG_CAN_MULTI_CONN. Set it only if the
	// Backend is consistent across connections: a Flush issued through
	// one connection makes durable the writes completed through any
	// connection, and a completed write is visible to reads on all.
	MultiConn bool
	// Size constraints advertised in NBD_INFO_BLOCK_SIZE and enforced
	// (EINVAL) on every request. Zero values default to 512, 4096 and
	// 32 MiB. MinBlock must be a power of two no larger than 64 KiB,
	// PrefBlock a power of two at least max(MinBlock, 512), MaxBlock at
	// least PrefBlock.
	MinBlock, PrefBlock, MaxBlock uint32
}

// Default size constraints.
const (
	DefaultMinBlock  = 512
	DefaultPrefBlock = 4096
	DefaultMaxBlock  = 32 << 20
)

// withDefaults returns e with zero size constraints replaced by defaults.
func (e Export) withDefaults() Export {
	if e.MinBlock == 0 {
		e.MinBlock = DefaultMinBlock
	}
	if e.PrefBlock == 0 {
		e.PrefBlock = max(DefaultPrefBlock, e.MinBlock)
	}
	if e.MaxBlock == 0 {
		e.MaxBlock = max(DefaultMaxBlock, e.PrefBlock)
	}
	return e
}

// validate checks e (after withDefaults).
func (e Export) validate() error {
	switch {
	case e.Backend == nil:
		return fmt.Errorf("%w: export %q has no backend", ErrConfig, e.Name)
	case len(e.Name) > maxString:
		return fmt.Errorf("%w: export name of %d bytes exceeds %d", ErrConfig, len(e.Name), maxString)
	case len(e.Description) > maxString:
		return fmt.Errorf("%w: export %q: description of %d bytes exceeds %d", ErrConfig, e.Name, len(e.Description), maxString)
	case bits.OnesCount32(e.MinBlock) != 1 || e.MinBlock > 64<<10:
		return fmt.Errorf("%w: export %q: minimum block %d is not a power of two up to 65536", ErrConfig, e.Name, e.MinBlock)
	case bits.OnesCount32(e.PrefBlock) != 1 || e.PrefBlock < max(e.MinBlock, 512):
		return fmt.Errorf("%w: export %q: preferred block %d is not a power of two >= max(minimum %d, 512)", ErrConfig, e.Name, e.PrefBlock, e.MinBlock)
	case e.MaxBlock < e.PrefBlock:
		return fmt.Errorf("%w: export %q: maximum payload %d below preferred block %d", ErrConfig, e.Name, e.MaxBlock, e.PrefBlock)
	}
	return nil
}

// transmissionFlags are the flags advertised for e.
func (e Export) transmissionFlags() uint16 {
	f := FlagHasFlags
	if e.ReadOnly {
		f |= FlagReadOnly
	} else {
		f |= FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes
	}
	if e.MultiConn {
		f |= FlagCanMultiConn
	}
	return f
}
