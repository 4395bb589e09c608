package store

import (
	"context"
	"fmt"
	"sync"
)

// volume implements Volume: it checks arguments and ranges, tracks
// operations in flight and adds context to errors; dev does the I/O.
type volume struct {
	store *volumeStore
	name  string // the volume's name
	ref   string // what was opened: name, or "name@snap"
	info  VolumeInfo
	dev   blockDevice

	// mu is held shared by every operation and exclusively by Close, so
	// Close waits for operations in flight.
	mu     sync.RWMutex
	closed bool
}

func (v *volume) Info() VolumeInfo {
	info := v.info.clone()
	info.Size = int64(v.dev.blocks()) * BlockSize
	return info
}

func (v *volume) InMemory() bool {
	_, ok := v.dev.(memDevice)
	return ok
}

// checkRange reports whether count blocks at lba lie inside a volume of n
// blocks, without overflowing.
func checkRange(lba, count, n uint64) error {
	if count > n || lba > n-count {
		return fmt.Errorf("%d blocks at %d, volume has %d: %w", count, lba, n, ErrOutOfRange)
	}
	return nil
}

// begin starts an operation: it takes the shared lock (the caller must call
// v.mu.RUnlock) and checks the handle, the context and the range.
func (v *volume) begin(ctx context.Context, lba, count uint64) error {
	v.mu.RLock()
	if v.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return checkRange(lba, count, v.dev.blocks())
}

// beginWrite is begin for an operation that changes data.
func (v *volume) beginWrite(ctx context.Context, lba, count uint64) error {
	if err := v.begin(ctx, lba, count); err != nil {
		return err
	}
	if v.info.ReadOnly {
		return fmt.Errorf("%s is a snapshot: %w", v.ref, ErrReadOnly)
	}
	return nil
}

func (v *volume) opError(op string, lba, count uint64, err error) error {
	return &OpError{Op: op, Volume: v.ref, LBA: lba, Count: count, Err: err}
}

// bufBlocks returns the number of blocks in a buffer of n bytes.
func bufBlocks(n int) (uint64, error) {
	if n%BlockSize != 0 {
		return 0, fmt.Errorf("buffer of %d bytes is not a multiple of %d: %w", n, BlockSize, ErrInvalid)
	}
	return uint64(n / BlockSize), nil
}

func (v *volume) ReadBlocks(ctx context.Context, lba uint64, dst []byte) error {
	count, err := bufBlocks(len(dst))
	if err != nil {
		return v.opError("read", lba, count, err)
	}
	defer v.mu.RUnlock()
	if err := v.begin(ctx, lba, count); err != nil {
		return v.opError("read", lba, count, err)
	}
	if count == 0 {
		return nil
	}
	if err := v.dev.read(ctx, lba, dst); err != nil {
		return v.opError("read", lba, count, err)
	}
	return nil
}

func (v *volume) TryReadBlocks(lba uint64, dst []byte) bool {
	tr, ok := v.dev.(tryReader)
	if !ok || len(dst) == 0 || len(dst)%BlockSize != 0 || !v.mu.TryRLock() {
		return false
	}
	defer v.mu.RUnlock()
	if v.closed || checkRange(lba, uint64(len(dst)/BlockSize), v.dev.blocks()) != nil {
		return false
	}
	return tr.tryRead(lba, dst)
}

func (v *volume) TryWriteBlocks(lba uint64, src []byte) bool {
	tw, ok := v.dev.(tryWriter)
	if !ok || len(src) == 0 || len(src)%BlockSize != 0 || v.info.ReadOnly || !v.mu.TryRLock() {
		return false
	}
	defer v.mu.RUnlock()
	if v.closed || checkRange(lba, uint64(len(src)/BlockSize), v.dev.blocks()) != nil {
		return false
	}
	return tw.tryWrite(lba, src)
}

func (v *volume) WriteBlocks(ctx context.Context, lba uint64, src []byte, fua bool) error {
	count, err := bufBlocks(len(src))
	if err != nil {
		return v.opError("write", lba, count, err)
	}
	defer v.mu.RUnlock()
	if err := v.beginWrite(ctx, lba, count); err != nil {
		return v.opError("write", lba, count, err)
	}
	if count == 0 {
		if fua {
			err = v.dev.flush(ctx)
		}
	} else {
		err = v.dev.write(ctx, lba, src, fua)
	}
	if err != nil {
		return v.opError("write", lba, count, err)
	}
	return nil
}

func (v *volume) Flush(ctx context.Context) error {
	defer v.mu.RUnlock()
	if err := v.begin(ctx, 0, 0); err != nil {
		return v.opError("flush", 0, 0, err)
	}
	if err := v.dev.flush(ctx); err != nil {
		return v.opError("flush", 0, 0, err)
	}
	return nil
}

func (v *volume) Trim(ctx context.Context, lba, count uint64) error {
	return v.discard(ctx, "trim", lba, count, false)
}

func (v *volume) WriteZeroes(ctx context.Context, lba, count uint64, fua bool) error {
	return v.discard(ctx, "write-zeroes", lba, count, fua)
}

func (v *volume) discard(ctx context.Context, op string, lba, count uint64, fua bool) error {
	defer v.mu.RUnlock()
	if err := v.beginWrite(ctx, lba, count); err != nil {
		return v.opError(op, lba, count, err)
	}
	var err error
	if count > 0 {
		err = v.dev.discard(ctx, lba, count, fua)
	} else if fua {
		err = v.dev.flush(ctx)
	}
	if err != nil {
		return v.opError(op, lba, count, err)
	}
	return nil
}

func (v *volume) WriteZeroesAllocated(ctx context.Context, lba, count uint64, fua bool) error {
	const op = "write-zeroes-allocated"
	defer v.mu.RUnlock()
	if err := v.beginWrite(ctx, lba, count); err != nil {
		return v.opError(op, lba, count, err)
	}
	var err error
	if count > 0 {
		if za, ok := v.dev.(zeroAllocator); ok {
			err = za.zeroAllocated(ctx, lba, count)
		} else {
			err = writeZeroBlocks(ctx, v.dev, lba, count)
		}
	}
	if err == nil && fua {
		err = v.dev.flush(ctx)
	}
	if err != nil {
		return v.opError(op, lba, count, err)
	}
	return nil
}

// zeroChunk is the zeros writeZeroBlocks writes at a time, shared by every
// caller: the devices only read a write's source, never write into it.
var zeroChunk = make([]byte, zeroChunkBlocks*BlockSize)

// zeroChunkBlocks is the blocks of zeroChunk (1 MiB): each write of it
// locks that much of the volume, not the whole range.
const zeroChunkBlocks = 256

// writeZeroBlocks zeroes count blocks at lba by writing zeros, as any
// write: every backend then allocates them as it allocates written data
// (the thin store maps a cluster of the volume's own, copying a shared
// one first, and writes it; the memory store keeps the blocks; a file
// gets its blocks written, which SEEK_DATA reports as data; rbd writes
// the objects), so later writes need no new space.
func writeZeroBlocks(ctx context.Context, dev blockDevice, lba, count uint64) error {
	for count > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(count, zeroChunkBlocks)
		if err := dev.write(ctx, lba, zeroChunk[:n*BlockSize], false); err != nil {
			return err
		}
		lba, count = lba+n, count-n
	}
	return nil
}

func (v *volume) BlockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	defer v.mu.RUnlock()
	if err := v.begin(ctx, lba, count); err != nil {
		return v.opError("block-status", lba, count, err)
	}
	if count == 0 {
		return nil
	}
	if err := v.dev.blockStatus(ctx, lba, count, fn); err != nil {
		return v.opError("block-status", lba, count, err)
	}
	return nil
}

func (v *volume) Close() error {
	v.mu.Lock()
	closed := v.closed
	v.mu.Unlock()
	if closed {
		return fmt.Errorf("store: close volume %q: %w", v.ref, ErrClosed)
	}
	err := v.shut()
	v.store.release(v)
	if err != nil {
		return fmt.Errorf("store: close volume %q: %w", v.ref, err)
	}
	return nil
}

// shut marks the handle closed once operations in flight are done and
// releases its device; a handle already shut returns nil.
func (v *volume) shut() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil
	}
	v.closed = true
	return v.dev.release()
}

// extentRun merges per-block (or per-unit) allocation states into extents
// for BlockStatus: add appends a run, done flushes the last. It stops (add
// returns false) when fn does.
type extentRun struct {
	fn      func(Extent) bool
	cur     Extent
	have    bool
	stopped bool
}

func (r *extentRun) add(lba, count uint64, hole bool) bool {
	if r.stopped || count == 0 {
		return !r.stopped
	}
	if r.have && r.cur.Hole == hole && r.cur.LBA+r.cur.Count == lba {
		r.cur.Count += count
		return true
	}
	if r.have && !r.fn(r.cur) {
		r.stopped = true
		return false
	}
	r.cur, r.have = Extent{LBA: lba, Count: count, Hole: hole}, true
	return true
}

func (r *extentRun) done() {
	if r.have && !r.stopped {
		r.fn(r.cur)
	}
}
