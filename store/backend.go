package store

import "context"

// backend is what a storage engine provides; volumeStore and volume add the
// semantics every engine shares (argument and range checks, open handles,
// ErrBusy, ErrClosed, error context).
type backend interface {
	// createVolume stores a new volume record, assigning info.ID. It returns
	// ErrExists if the name is taken.
	createVolume(ctx context.Context, info VolumeInfo) (VolumeInfo, error)
	// getVolume returns the record of a volume, or ErrNotFound.
	getVolume(ctx context.Context, name string) (VolumeInfo, error)
	// listVolumes returns all records in any order.
	listVolumes(ctx context.Context) ([]VolumeInfo, error)
	// deleteVolume removes a volume record and its blocks.
	deleteVolume(ctx context.Context, info VolumeInfo) error
	// device returns the block device of an existing volume.
	device(info VolumeInfo) blockDevice
	sync(ctx context.Context) error
	// close syncs and releases the engine; no calls are in flight.
	close() error
}

// blockDevice is the block array of one volume. Arguments are already
// checked: buffers are whole blocks and ranges lie inside the volume.
type blockDevice interface {
	read(ctx context.Context, lba uint64, dst []byte) error
	write(ctx context.Context, lba uint64, src []byte, fua bool) error
	// discard makes count blocks at lba read as zeros.
	discard(ctx context.Context, lba, count uint64, fua bool) error
	flush(ctx context.Context) error
}
