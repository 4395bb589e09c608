package store

import "context"

// backend is what a storage engine provides; volumeStore and volume add the
// semantics every engine shares (argument, name and range checks, open
// handles, ErrBusy, ErrClosed, error context). volumeStore serializes the
// calls that change one volume's catalog entry against each other and
// against opens where the Store contract needs it; backends serialize the
// rest themselves.
type backend interface {
	// createVolume stores a new volume record, assigning info.ID (info has
	// Name, Size, Created, Meta and Kind set). It returns ErrExists if the
	// name is taken.
	createVolume(ctx context.Context, info VolumeInfo, opts CreateOptions) (VolumeInfo, error)
	// getVolume returns the identity fields of a volume, or ErrNotFound.
	getVolume(ctx context.Context, name string) (VolumeInfo, error)
	// statVolume returns a volume with its space figures and snapshots.
	statVolume(ctx context.Context, name string) (VolumeInfo, error)
	// listVolumes returns all volumes as statVolume does, in any order.
	listVolumes(ctx context.Context) ([]VolumeInfo, error)
	// deleteVolume removes a volume, its snapshots and its data. No handle
	// is open on it; its snapshots have no clones (checked by the backend:
	// ErrHasDependents).
	deleteVolume(ctx context.Context, info VolumeInfo) error
	// resizeVolume sets a volume's size; open reports whether handles are
	// open (then size is larger than the current one).
	resizeVolume(ctx context.Context, info VolumeInfo, size int64, open bool) error
	createSnapshot(ctx context.Context, info VolumeInfo, snap string) (SnapshotInfo, error)
	// deleteSnapshot: no handle is open on the snapshot.
	deleteSnapshot(ctx context.Context, info VolumeInfo, snap string) error
	// clone creates volume info (Name, Size unset, Created, Meta set) from
	// snapshot snap of origin.
	clone(ctx context.Context, origin VolumeInfo, snap string, info VolumeInfo) (VolumeInfo, error)
	// rollback: no handle is open on the volume.
	rollback(ctx context.Context, info VolumeInfo, snap string) error
	setMeta(ctx context.Context, info VolumeInfo, meta map[string]string) error
	// open returns the block device of an existing volume, or with snap set
	// of one of its snapshots (read-only), and the info the handle reports.
	open(ctx context.Context, info VolumeInfo, snap string) (blockDevice, VolumeInfo, error)
	sync(ctx context.Context) error
	// close syncs and releases the engine; no calls are in flight and
	// every device is released.
	close() error
}

// blockDevice is the block array of one open volume handle. Arguments are
// already checked: buffers are whole blocks and ranges lie inside the
// volume.
// tryReader is a blockDevice that can read without blocking: tryRead
// reads all of dst when that needs no I/O and no wait for a lock, and
// reports whether it did (see Volume.TryReadBlocks).
type tryReader interface {
	tryRead(lba uint64, dst []byte) bool
}

// tryWriter is a blockDevice that can write without blocking for long:
// tryWrite writes all of src when that needs no copy, no wait for another
// request's locks and no commit, and reports whether it did (see Volume.TryWriteBlocks).
type tryWriter interface {
	tryWrite(lba uint64, src []byte) bool
}

// zeroAllocator is a blockDevice with a way of its own to zero blocks
// keeping them allocated (Volume.WriteZeroesAllocated); a device without
// one gets zeros written through write.
type zeroAllocator interface {
	zeroAllocated(ctx context.Context, lba, count uint64) error
}

type blockDevice interface {
	// blocks is the volume's current size in blocks.
	blocks() uint64
	read(ctx context.Context, lba uint64, dst []byte) error
	write(ctx context.Context, lba uint64, src []byte, fua bool) error
	// discard makes count blocks at lba read as zeros.
	discard(ctx context.Context, lba, count uint64, fua bool) error
	flush(ctx context.Context) error
	blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error
	// release is called once when the handle closes, after its operations.
	release() error
}
