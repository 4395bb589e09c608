package store

import (
	"context"
	"maps"
	"slices"
	"time"
)

// BlockSize is the size in bytes of one block, the unit of every Volume
// operation.
const BlockSize = 4096

// MaxAtomicWrite is the largest WriteBlocks, in bytes, that is atomic with
// respect to concurrent readers and writers of the same handle set (32 MiB,
// the largest NBD request). Across a crash only each block is atomic: see
// Volume.
const MaxAtomicWrite = 32 << 20

// Volume kinds, the Kind of a VolumeInfo. Backends outside this package
// name their own ("rbd").
const (
	KindThin   = "thin"   // thin-provisioned in the data files of a thin store
	KindRaw    = "raw"    // an existing file or block device served as it is
	KindMemory = "memory" // in the memory store
)

// VolumeInfo describes a volume. It is a value: the maps and slices of a
// VolumeInfo returned by this package are private copies the caller may
// keep or modify.
//
// Volume.Info fills the identity fields (Name to ReadOnly); StatVolume and
// ListVolumes fill the space figures and Snapshots too, which may cost a
// scan of the volume's metadata.
type VolumeInfo struct {
	Name    string            // unique within its Store; "VOL@SNAP" for a snapshot opened read-only
	ID      uint32            // assigned at creation, never reused, stable across restarts
	Size    int64             // bytes, a positive multiple of BlockSize (raw: the file's now; 0 if Unavailable)
	Created time.Time         // creation time (UTC)
	Meta    map[string]string // caller-defined, stored with the volume

	Kind     string // KindThin, KindRaw, KindMemory, or a backend's own
	Origin   string // "VOL@SNAP" a clone was made from; "" otherwise
	RawPath  string // the file or device of a KindRaw volume
	ReadOnly bool   // a snapshot handle: writes fail with ErrReadOnly

	// Allocated is the bytes the volume's own map holds (clusters shared
	// with its snapshots included; for a clone, not what it still reads
	// from its origin). Exclusive is the part of it no snapshot or other
	// volume references: what deleting the volume alone would free. For a
	// raw volume both are the bytes its file occupies.
	Allocated int64
	Exclusive int64
	Snapshots []SnapshotInfo // oldest first

	// Unavailable is why the volume cannot be opened now, "" when it can:
	// a raw volume whose file or device is gone (deleted, or the device
	// detached) or holds no whole block. StatVolume and ListVolumes
	// describe such a volume rather than fail; its Size, Allocated and
	// Exclusive are then 0 (unknown), and OpenVolume fails naming the
	// path. It comes back as it was once its file does.
	Unavailable string
}

// SnapshotInfo describes a snapshot of a volume.
type SnapshotInfo struct {
	Name      string
	Created   time.Time // UTC
	Size      int64     // the volume's size when it was taken
	Exclusive int64     // bytes that deleting the snapshot frees
	Clones    []string  // volumes cloned from it, sorted
}

// CreateOptions are the optional parts of a new volume.
type CreateOptions struct {
	// Meta is stored with the volume (at most MaxMetaLen bytes of UTF-8).
	Meta map[string]string
	// Raw serves this existing file or block device as the volume, as it
	// is: block n of the volume is bytes n*BlockSize of the file. The size
	// argument of CreateVolume must then be 0 (the volume's size is the
	// file's, rounded down to a whole block) or equal to it. Raw volumes
	// have no snapshots (ErrNotSupported) and keep their file's size (a
	// resize to another size: ErrNotSupported); deleting one forgets it
	// and leaves the file alone.
	Raw string
}

// Blocks returns the volume's size in blocks.
func (vi VolumeInfo) Blocks() uint64 { return uint64(vi.Size) / BlockSize }

// clone returns vi with its own copies of Meta and Snapshots.
func (vi VolumeInfo) clone() VolumeInfo {
	if vi.Meta != nil {
		vi.Meta = maps.Clone(vi.Meta)
	}
	if vi.Snapshots != nil {
		vi.Snapshots = slices.Clone(vi.Snapshots)
		for i := range vi.Snapshots {
			vi.Snapshots[i].Clones = slices.Clone(vi.Snapshots[i].Clones)
		}
	}
	return vi
}

// Store holds named volumes and their snapshots. All methods are safe for
// concurrent use.
//
// Names: a volume or snapshot name is 1 to MaxNameLen bytes of UTF-8
// without control characters, '@' or '/'. "VOL@SNAP" names snapshot SNAP
// of volume VOL where the methods say so.
type Store interface {
	// CreateVolume creates an empty (all-zero) volume, or with opts.Raw a
	// raw one. size must be a positive multiple of BlockSize. It fails with
	// ErrExists if a volume of that name exists; an existing volume is never
	// modified.
	CreateVolume(ctx context.Context, name string, size int64, opts CreateOptions) (VolumeInfo, error)
	// OpenVolume returns a handle on an existing volume, or ErrNotFound.
	// A volume may be open several times at once. "VOL@SNAP" opens a
	// snapshot read-only.
	OpenVolume(ctx context.Context, name string) (Volume, error)
	// StatVolume describes one volume, space figures and snapshots
	// included.
	StatVolume(ctx context.Context, name string) (VolumeInfo, error)
	// ListVolumes returns all volumes, sorted by name, described as
	// StatVolume does.
	ListVolumes(ctx context.Context) ([]VolumeInfo, error)
	// DeleteVolume removes a volume, its snapshots and all its data. It
	// fails with ErrBusy while a handle on the volume or one of its
	// snapshots is open, and with ErrHasDependents while a clone of one of
	// its snapshots exists.
	DeleteVolume(ctx context.Context, name string) error
	// ResizeVolume changes a volume's size (a positive multiple of
	// BlockSize). Growing is allowed while the volume is open: the open
	// handles see the new size at once (Info, range checks); the new
	// blocks read as zeros. Shrinking discards the blocks past the new end
	// and fails with ErrBusy while the volume is open. Snapshots keep their
	// own size.
	ResizeVolume(ctx context.Context, name string, size int64) error
	// GrowVolume is ResizeVolume that never shrinks: a size below the
	// volume's, also one the volume reached meanwhile, fails with ErrShrink
	// and changes nothing. The same size is not an error.
	GrowVolume(ctx context.Context, name string, size int64) error
	// CreateSnapshot takes a read-only, point-in-time snapshot of a volume,
	// open or not: every write acknowledged before the call is in it, none
	// started after it returns. It takes constant time, whatever the
	// volume's size. Across a crash the snapshot keeps, like the volume,
	// what was made durable (by Flush, FUA or Sync): a snapshot taken after
	// a Flush holds everything that Flush covered; a backend may make it
	// durable whole (rbd flushes first).
	CreateSnapshot(ctx context.Context, vol, snap string) (SnapshotInfo, error)
	// DeleteSnapshot removes a snapshot anywhere in the volume's chain and
	// frees the data only it referenced. It fails with ErrBusy while the
	// snapshot is open and with ErrHasDependents while it has clones.
	DeleteSnapshot(ctx context.Context, vol, snap string) error
	// Clone creates a writable volume newName whose content is snapshot
	// vol@snap; the two share their data until either side writes (copy on
	// write). It takes constant time. opts.Raw must be empty.
	Clone(ctx context.Context, vol, snap, newName string, opts CreateOptions) (VolumeInfo, error)
	// Rollback makes a volume's content and size those of one of its
	// snapshots. The snapshots (older and newer) and clones stay. It fails
	// with ErrBusy while the volume is open.
	Rollback(ctx context.Context, vol, snap string) error
	// SetMeta replaces a volume's caller-defined map.
	SetMeta(ctx context.Context, name string, meta map[string]string) error
	// Sync makes everything acknowledged so far durable.
	Sync(ctx context.Context) error
	// Close syncs, closes every open Volume handle and releases the store.
	// Afterwards every method fails with ErrClosed.
	Close() error
}

// Syncer is implemented by the Stores of this package: Syncs counts the
// syncs to stable storage done so far (see Durability in the package
// documentation); always 0 for the memory store, which has nothing to sync.
type Syncer interface {
	Syncs() uint64
}

// HealthChecker is implemented by the Stores of this package: Health
// reports why the store, or one of its volumes, refuses writes and flushes
// until it is reopened (a sync that failed: see Durability in the package
// documentation), or cannot write any more (its file system shut down or
// read-only), or nil.
type HealthChecker interface {
	Health() error
}

// Extent is a run of blocks of the same allocation state, as BlockStatus
// reports it.
type Extent struct {
	LBA, Count uint64
	// Hole: the blocks are not allocated, read as zeros and cost no I/O to
	// read (NBD's NBD_STATE_HOLE|NBD_STATE_ZERO). Otherwise they are
	// allocated data, which may still read as zeros.
	Hole bool
}

// Volume is an open handle on an array of BlockSize blocks. All methods are
// safe for concurrent use by many goroutines.
//
// lba and count are in blocks; buffers are a whole number of blocks long.
// A request reaching beyond the end of the volume fails with ErrOutOfRange
// and has no effect. Blocks never written read as zeros.
//
// Concurrent requests: a single WriteBlocks of up to MaxAtomicWrite bytes
// is atomic for readers and writers of the volume: a concurrent ReadBlocks
// sees either all of its blocks or none of them, and of overlapping
// concurrent writes the last one wins for every block they share. Trim and
// WriteZeroes are atomic per block only.
//
// Crashes: what Flush, a FUA write or a FUA WriteZeroes made durable
// survives a crash of the process or of the machine. A write that was not
// made durable may be lost, or, if it spans several blocks, survive in part:
// each block holds either its old or its new content, never a mix.
type Volume interface {
	// Info describes the volume (the identity fields; see VolumeInfo). Its
	// Size follows a grow made while the handle is open.
	Info() VolumeInfo
	// ReadBlocks fills dst with the blocks starting at lba. A stored block
	// that fails its checksum makes the read fail with ErrChecksum; the
	// bytes of dst are then zeroed, never filled with the bad data.
	ReadBlocks(ctx context.Context, lba uint64, dst []byte) error
	// WriteBlocks stores src at lba. With fua set the data is durable before
	// WriteBlocks returns. On a snapshot handle it fails with ErrReadOnly.
	WriteBlocks(ctx context.Context, lba uint64, src []byte, fua bool) error
	// Flush makes every write acknowledged before the call durable.
	Flush(ctx context.Context) error
	// Trim discards count blocks at lba; they read as zeros afterwards, and
	// whole allocation units in the range are freed.
	Trim(ctx context.Context, lba, count uint64) error
	// WriteZeroes sets count blocks at lba to zeros (by discarding them).
	// With fua set the change is durable before it returns.
	WriteZeroes(ctx context.Context, lba, count uint64, fua bool) error
	// WriteZeroesAllocated sets count blocks at lba to zeros and leaves
	// them allocated to the volume, as NBD's NBD_CMD_FLAG_NO_HOLE asks: a
	// later write of these blocks needs no new space (unless a snapshot
	// taken meanwhile shares them again), and BlockStatus reports them as
	// data. Blocks shared with a snapshot or a clone's origin get blocks
	// of their own (copy on write). With fua set the change is durable
	// before it returns. Like WriteZeroes it is atomic per block only.
	WriteZeroesAllocated(ctx context.Context, lba, count uint64, fua bool) error
	// BlockStatus reports the allocation of count blocks at lba as
	// consecutive extents in lba order, covering the range exactly (the
	// last may be cut at lba+count); fn returns false to stop early. It
	// feeds NBD_CMD_BLOCK_STATUS (base:allocation).
	BlockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error
	// Close releases the handle, waiting for its operations in flight.
	// Using the handle afterwards fails with ErrClosed.
	Close() error
	// InMemory reports whether ReadBlocks and WriteBlocks only copy
	// memory (they never wait for I/O), so a caller may run them where it
	// must not block for long.
	InMemory() bool
	// TryReadBlocks is ReadBlocks for a caller that must not block (a
	// completion handler): it reads only what needs no I/O and no wait
	// for a lock (blocks in memory or in the page cache), and reports
	// whether it read all of dst. When it did not, dst holds anything and
	// the caller uses ReadBlocks, which also reports the errors
	// TryReadBlocks leaves alone (range, closed handle, I/O errors).
	TryReadBlocks(lba uint64, dst []byte) bool
	// TryWriteBlocks is WriteBlocks without FUA for a caller that must not
	// block for long (a completion handler): it writes only where that
	// needs no copy of other data, no wait for another request's locks and
	// no wait for a commit (blocks in memory; blocks the volume alone holds, or a new
	// allocation, written into the page cache, which may still throttle a
	// writer that dirties pages faster than they are written back), and
	// reports whether it wrote all of src. When it did not, the blocks
	// hold their old or the new data and the caller uses WriteBlocks, which
	// also reports the errors TryWriteBlocks leaves alone.
	TryWriteBlocks(lba uint64, src []byte) bool
}
