package store

import (
	"context"
	"maps"
	"time"
)

// BlockSize is the size in bytes of one block, the unit of every Volume
// operation.
const BlockSize = 4096

// MaxAtomicWrite is the largest WriteBlocks, in bytes, that every backend
// performs atomically (32 MiB, the largest NBD request). Larger writes are
// atomic in pieces of at least this size.
const MaxAtomicWrite = 32 << 20

// VolumeInfo describes a volume. It is a value: the Meta map of a VolumeInfo
// returned by this package is a private copy the caller may keep or modify.
type VolumeInfo struct {
	Name    string            // unique within its Store
	ID      uint32            // assigned at creation, never reused, stable across restarts
	Size    int64             // bytes, a positive multiple of BlockSize
	Created time.Time         // creation time (UTC)
	Meta    map[string]string // caller-defined, stored with the volume
}

// Blocks returns the volume's size in blocks.
func (vi VolumeInfo) Blocks() uint64 { return uint64(vi.Size) / BlockSize }

// clone returns vi with its own copy of Meta.
func (vi VolumeInfo) clone() VolumeInfo {
	if vi.Meta != nil {
		vi.Meta = maps.Clone(vi.Meta)
	}
	return vi
}

// Store holds named volumes. All methods are safe for concurrent use.
type Store interface {
	// CreateVolume creates an empty (all-zero) volume. size must be a
	// positive multiple of BlockSize. It fails with ErrExists if a volume of
	// that name exists; an existing volume is never modified.
	CreateVolume(ctx context.Context, name string, size int64, meta map[string]string) (VolumeInfo, error)
	// OpenVolume returns a handle on an existing volume, or ErrNotFound.
	// A volume may be open several times at once.
	OpenVolume(ctx context.Context, name string) (Volume, error)
	// ListVolumes returns all volumes, sorted by name.
	ListVolumes(ctx context.Context) ([]VolumeInfo, error)
	// DeleteVolume removes a volume and all its blocks. It fails with
	// ErrBusy while any handle on the volume is open.
	DeleteVolume(ctx context.Context, name string) error
	// Sync makes everything acknowledged so far durable.
	Sync(ctx context.Context) error
	// Close syncs, closes every open Volume handle and releases the store.
	// Afterwards every method fails with ErrClosed.
	Close() error
}

// Syncer is implemented by the Stores of this package: Syncs counts the
// syncs to stable storage done so far, each a db.Sync with the fsyncs that
// complete it (see Durability in the package documentation); always 0 for
// the memory store, which has nothing to sync.
type Syncer interface {
	Syncs() uint64
}

// Volume is an open handle on an array of BlockSize blocks. All methods are
// safe for concurrent use by many goroutines.
//
// lba and count are in blocks; buffers are a whole number of blocks long.
// A request reaching beyond the end of the volume fails with ErrOutOfRange
// and has no effect. Blocks never written read as zeros.
//
// A single WriteBlocks of up to MaxAtomicWrite bytes is atomic: a concurrent
// or later reader, and the store after a crash, sees either all of its
// blocks or none of them. Overlapping concurrent writes are ordered as
// wholes: the last writer wins, for every block they share. A ReadBlocks
// sees one consistent snapshot. Trim and WriteZeroes are atomic per block
// only (a failed or cancelled one may leave part of its range discarded).
type Volume interface {
	// Info describes the volume.
	Info() VolumeInfo
	// ReadBlocks fills dst with the blocks starting at lba. A stored block
	// that fails its checksum makes the read fail with ErrChecksum; the
	// bytes of dst are then zeroed, never filled with the bad data.
	ReadBlocks(ctx context.Context, lba uint64, dst []byte) error
	// WriteBlocks stores src at lba. With fua set the data is durable before
	// WriteBlocks returns.
	WriteBlocks(ctx context.Context, lba uint64, src []byte, fua bool) error
	// Flush makes every write acknowledged before the call durable.
	Flush(ctx context.Context) error
	// Trim discards count blocks at lba; they read as zeros afterwards.
	Trim(ctx context.Context, lba, count uint64) error
	// WriteZeroes sets count blocks at lba to zeros (by discarding them).
	// With fua set the change is durable before it returns.
	WriteZeroes(ctx context.Context, lba, count uint64, fua bool) error
	// Close releases the handle, waiting for its operations in flight.
	// Using the handle afterwards fails with ErrClosed.
	Close() error
	// InMemory reports whether ReadBlocks and WriteBlocks only copy
	// memory (they never wait for I/O), so a caller may run them where it
	// must not block for long.
	InMemory() bool
}
