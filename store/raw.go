package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Raw volumes: an existing file or block device served as it is, block n
// at byte n*BlockSize, with pread and pwrite. The store keeps only the
// record; deleting the volume forgets it and leaves the file alone.

// rawSize returns the size of a raw file or device in whole blocks, in
// bytes. A block device is opened exclusively (openRawFile), so one that is
// mounted or held by another program is refused.
func rawSize(path string) (int64, error) {
	f, err := openRawFile(path, os.O_RDONLY)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return rawFileSize(f)
}

// openRawFile opens a raw volume's file or device. A block device is
// opened with O_EXCL, which Linux makes an exclusive claim on the device:
// it fails with EBUSY while a file system on it is mounted or another
// program (LVM, md, another rtarget) holds it so, and keeps them off while
// the volume is served, as LIO's block backstore does. Serving a mounted
// file system's device would corrupt it and feed the initiator garbage.
func openRawFile(path string, flag int) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
		flag |= syscall.O_EXCL
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, syscall.EBUSY) {
		return nil, fmt.Errorf("raw: %s is in use (a mounted file system, or held by another program): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}
	return f, nil
}

// checkRawPath refuses, for a new raw volume, a file inside the store's
// own directory dir (writes through the volume would overwrite the
// store's data or metadata) and the file or device of another raw volume
// (two names for the same blocks, whose locks and reservations would not
// see each other's users). Both paths are made absolute first: filepath.Rel
// of a relative and an absolute path fails, and rtarget's default --data
// is relative while the volume commands send absolute paths.
func checkRawPath(dir, path string, others []*thinRecord) error {
	real, err := realPath(path)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	realDir, err := realPath(dir)
	if err != nil {
		return fmt.Errorf("raw: the store's directory: %w", err)
	}
	if rel, err := filepath.Rel(realDir, real); err != nil {
		return fmt.Errorf("raw: %s against the store's directory %s: %w", path, dir, err)
	} else if rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("raw: %s is inside the store's directory %s: %w", path, dir, ErrInvalid)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	if fi.Mode().IsRegular() {
		if own, err := storeFileOf(realDir, fi); err != nil {
			return fmt.Errorf("raw: looking for %s among the store's files: %w", path, err)
		} else if own != "" {
			return fmt.Errorf("raw: %s is the store's own file %s under another name: %w", path, own, ErrInvalid)
		}
	}
	for _, r := range others {
		if r.Kind != KindRaw {
			continue
		}
		if ofi, err := os.Stat(r.RawPath); err == nil && os.SameFile(fi, ofi) {
			return fmt.Errorf("raw: %s is already served as volume %q: %w", path, r.Name, ErrExists)
		}
	}
	return nil
}

// storeFileOf returns the path of the regular file under dir that is fi's
// file (a hard link to it, or a bind mount of dir, gives it a name outside
// dir), or "" when there is none. The check by path above cannot see such
// names; this one compares device and inode numbers with every file of the
// store, a few dozen at most, once per raw volume created.
func storeFileOf(dir string, fi os.FileInfo) (string, error) {
	var found string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, os.ErrNotExist) {
				return nil // removed meanwhile (a badger table compacted away)
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if os.SameFile(fi, info) {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	return found, err
}

// realPath returns the absolute path of path with its symbolic links
// resolved.
func realPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

func rawFileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("raw: %w", err)
	}
	var size int64
	switch {
	case fi.Mode().IsRegular():
		size = fi.Size()
	case fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0:
		n, err := f.Seek(0, 2)
		if err != nil {
			return 0, fmt.Errorf("raw: size of %s: %w", f.Name(), err)
		}
		size = n
	default:
		return 0, fmt.Errorf("raw: %s is neither a regular file nor a block device: %w", f.Name(), ErrInvalid)
	}
	return wholeBlocks(f.Name(), size)
}

// wholeBlocks returns the n bytes of raw file name rounded down to a
// whole block; a file holding none cannot be a volume.
func wholeBlocks(name string, n int64) (int64, error) {
	n -= n % BlockSize
	if n <= 0 {
		return 0, fmt.Errorf("raw: %s holds no whole block: %w", name, ErrInvalid)
	}
	return n, nil
}

// rawStat returns the size of a raw volume's file or device in whole
// blocks, as an open would serve it, and the bytes it occupies on disk (a
// device: its size). A device is opened without O_EXCL: while the volume is
// served its handle holds the exclusive claim, and an exclusive open would
// fail (EBUSY). An error (the file deleted, the device detached) makes the
// volume unavailable, not its store: see VolumeInfo.Unavailable.
func rawStat(path string) (size, allocated int64, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, fmt.Errorf("raw: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f, err := os.Open(path)
		if err != nil {
			return 0, 0, fmt.Errorf("raw: %w", err)
		}
		defer f.Close()
		size, err := rawFileSize(f)
		return size, size, err
	}
	if size, err = wholeBlocks(path, fi.Size()); err != nil {
		return 0, 0, err
	}
	allocated = fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		allocated = st.Blocks * 512
	}
	return size, allocated, nil
}

// rawDevice is an open raw volume, shared by its handles.
type rawDevice struct {
	b       *thinBackend
	id      uint32
	handles int // thinBackend.volsMu

	name   string
	f      *os.File
	fd     int
	n      uint64 // blocks
	device bool   // a block device, not a regular file
	locks  clusterLocks

	syncs *syncGroup // fdatasyncs, one at a time (flush)
	// written counts the writes (and discards) whose bytes are in the
	// page cache; synced is the count the last finished fdatasync round
	// had read when it began, so every write counted up to it is durable.
	// They differ while a write awaits a round that began after it, also
	// while a round is still running: a round clears nothing when it
	// starts, so Sync cannot skip the volume before the round ends.
	written, synced atomic.Uint64
	// failed is the first fdatasync that failed. The kernel may have
	// dropped the pages it could not write, and it reports a write-back
	// error to each open file once: a later fdatasync can succeed with
	// writes acknowledged before it lost (PostgreSQL's "fsyncgate"). No
	// flush can promise durability after that, so the volume refuses
	// writes and flushes from then on, until the store is reopened (the
	// thin store does the same for its own data files, thinBackend.fail).
	// Reads go on.
	failed atomic.Pointer[error]
}

// rawFailure is a raw volume's failed fdatasync, kept while no handle
// holds its rawDevice (thinBackend.rawFailed).
type rawFailure struct {
	name string
	err  *error
}

// rawLockBlocks is the unit of rawDevice's request locks.
const rawLockBlocks = 16

func (b *thinBackend) openRaw(rec *thinRecord) (*rawDevice, error) {
	b.volsMu.Lock()
	defer b.volsMu.Unlock()
	if d := b.raws[rec.ID]; d != nil {
		d.handles++
		return d, nil
	}
	f, err := openRawFile(rec.RawPath, os.O_RDWR)
	if err != nil {
		return nil, fmt.Errorf("raw volume %q: %w", rec.Name, err)
	}
	size, err := rawFileSize(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	fi, _ := f.Stat()
	d := &rawDevice{b: b, id: rec.ID, handles: 1, name: rec.Name, f: f, fd: int(f.Fd()), n: uint64(size) / BlockSize,
		device: !fi.Mode().IsRegular()}
	d.syncs = newSyncGroup(d.syncRound)
	if f, ok := b.rawFailed[rec.ID]; ok {
		d.failed.Store(f.err)
	}
	b.raws[rec.ID] = d
	return d, nil
}

func (d *rawDevice) blocks() uint64 { return d.n }

// release drops a handle. The last one closes the file, after an
// fdatasync of what was written since the last: Store.Sync makes durable
// what the open raw volumes hold (thinBackend.sync), so a volume no handle
// holds must have nothing left to sync. That fdatasync runs under volsMu;
// it is rare, since the target flushes a volume before it closes its last
// handle, leaving nothing to sync here.
func (d *rawDevice) release() error {
	d.b.volsMu.Lock()
	defer d.b.volsMu.Unlock()
	if d.handles--; d.handles > 0 {
		return nil
	}
	delete(d.b.raws, d.id)
	var errSync error
	if d.unsynced() && d.failed.Load() == nil {
		errSync = d.flush(context.Background())
	}
	if p := d.failed.Load(); p != nil {
		d.b.rawFailed[d.id] = rawFailure{d.name, p} // for the next open
	}
	return errors.Join(errSync, d.f.Close())
}

func (d *rawDevice) lock(lba, count uint64, excl bool) lockedClusters {
	return d.locks.lock(lba/rawLockBlocks, (lba+count-1)/rawLockBlocks, excl)
}

func (d *rawDevice) read(_ context.Context, lba uint64, dst []byte) error {
	l := d.lock(lba, uint64(len(dst))/BlockSize, false)
	defer l.unlock()
	pos := int64(lba) * BlockSize
	if err := pread(d.fd, dst, pos); err != nil {
		return fmt.Errorf("raw read at %d: %w", pos, err)
	}
	return nil
}

// tryRead reads a request within one lock stripe that no writer holds,
// from the page cache only.
func (d *rawDevice) tryRead(lba uint64, dst []byte) bool {
	l := d.stripe(lba, len(dst))
	if l == nil || !l.TryRLock() {
		return false
	}
	defer l.RUnlock()
	return preadNoWait(d.fd, dst, int64(lba)*BlockSize)
}

// stripe returns the lock stripe of n bytes at lba, nil when they span two.
func (d *rawDevice) stripe(lba uint64, n int) *sync.RWMutex {
	first, last := lba/rawLockBlocks, (lba+uint64(n)/BlockSize-1)/rawLockBlocks
	if first != last {
		return nil
	}
	return &d.locks[first%numClusterLocks]
}

// tryWrite writes a request within one lock stripe that no one holds, in
// place (a raw volume allocates nothing; the file system may, in a sparse
// file, which is its own business).
func (d *rawDevice) tryWrite(lba uint64, src []byte) bool {
	l := d.stripe(lba, len(src))
	if l == nil || d.failed.Load() != nil || !l.TryLock() {
		return false
	}
	defer l.Unlock()
	return d.pwrite(src, int64(lba)*BlockSize) == nil
}

// pwrite writes all of src at byte pos.
func (d *rawDevice) pwrite(src []byte, pos int64) error {
	defer d.written.Add(1) // also after a partial write
	for len(src) > 0 {
		n, err := unix.Pwrite(d.fd, src, pos)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("raw write at %d: %w", pos, noSpace(err))
		}
		src, pos = src[n:], pos+int64(n)
	}
	return nil
}

func (d *rawDevice) write(ctx context.Context, lba uint64, src []byte, fua bool) error {
	if err := d.checkFailed(); err != nil {
		return err
	}
	l := d.lock(lba, uint64(len(src))/BlockSize, true)
	err := d.pwrite(src, int64(lba)*BlockSize)
	l.unlock()
	if err == nil && fua {
		err = d.flush(ctx)
	}
	return err
}

func (d *rawDevice) discard(ctx context.Context, lba, count uint64, fua bool) error {
	if err := d.checkFailed(); err != nil {
		return err
	}
	l := d.lock(lba, count, true)
	pos, n := int64(lba)*BlockSize, int64(count)*BlockSize
	err := fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, pos, n)
	if err != nil && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP)) {
		err = d.writeZeros(pos, n)
	}
	d.written.Add(1)
	l.unlock()
	if err != nil {
		return fmt.Errorf("raw discard at %d (%d bytes): %w", pos, n, err)
	}
	if fua {
		return d.flush(ctx)
	}
	return nil
}

// zeroAllocated zeroes count blocks at lba keeping them allocated
// (Volume.WriteZeroesAllocated). A block device zeroes them itself:
// fallocate ZERO_RANGE on a block device is the kernel's zero-out without
// unmapping (WRITE ZEROES or WRITE SAME where the device has them, zero
// pages written otherwise), with no data sent from here. A regular file
// gets zeros written: ZERO_RANGE would allocate its blocks as unwritten
// extents, which SEEK_DATA, and so BlockStatus, reports as holes on ext4
// and XFS, and PUNCH_HOLE would free them.
func (d *rawDevice) zeroAllocated(ctx context.Context, lba, count uint64) error {
	if err := d.checkFailed(); err != nil {
		return err
	}
	if !d.device {
		return writeZeroBlocks(ctx, d, lba, count)
	}
	l := d.lock(lba, count, true)
	pos, n := int64(lba)*BlockSize, int64(count)*BlockSize
	err := fallocate(d.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, pos, n)
	d.written.Add(1)
	l.unlock()
	if err != nil && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP)) {
		return writeZeroBlocks(ctx, d, lba, count)
	}
	if err != nil {
		return fmt.Errorf("raw zero range at %d (%d bytes): %w", pos, n, noSpace(err))
	}
	return nil
}

// writeZeros zeroes a range where punching holes is not supported.
func (d *rawDevice) writeZeros(pos, n int64) error {
	zeros := zeroChunk // read only
	for n > 0 {
		k, err := unix.Pwrite(d.fd, zeros[:min(n, int64(len(zeros)))], pos)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		pos, n = pos+int64(k), n-int64(k)
	}
	return nil
}

// flush makes what was written durable: one fdatasync, shared by the
// callers that come while another runs (syncGroup). fdatasyncs of one file
// must not run side by side: the kernel reports a write-back error to the
// open file once, so one of them would fail and the others succeed, with
// their writes lost.
func (d *rawDevice) flush(ctx context.Context) error {
	if err := d.checkFailed(); err != nil {
		return err
	}
	return d.syncs.Sync(ctx)
}

// syncRound is one fdatasync of the file (d.syncs).
func (d *rawDevice) syncRound() error {
	if err := d.checkFailed(); err != nil {
		return err
	}
	w := d.written.Load()
	if err := d.b.rawSync(d.fd); err != nil {
		return d.fail(fmt.Errorf("raw fdatasync: %w", err))
	}
	d.synced.Store(w) // rounds run one at a time (d.syncs): w only grows
	return nil
}

// unsynced reports writes that no finished fdatasync round covers.
func (d *rawDevice) unsynced() bool { return d.written.Load() != d.synced.Load() }

// rawSync fdatasyncs a raw volume's file descriptor fd.
func (b *thinBackend) rawSync(fd int) error {
	if h := b.rawSyncHook.Load(); h != nil {
		if err := (*h)(); err != nil {
			return err
		}
	}
	return unix.Fdatasync(fd)
}

// fail records the failure of an fdatasync (see rawDevice.failed).
func (d *rawDevice) fail(err error) error {
	if d.failed.CompareAndSwap(nil, &err) {
		d.b.log.Error("a raw volume's data may be lost: it refuses writes and flushes until the store is reopened",
			"volume", d.name, "err", err)
	}
	return d.checkFailed()
}

// checkFailed returns the error of a write or flush after a failed
// fdatasync.
func (d *rawDevice) checkFailed() error {
	if p := d.failed.Load(); p != nil {
		return fmt.Errorf("an earlier fdatasync of the raw volume failed, writes to it may be lost; "+
			"it refuses writes and flushes until the store is reopened: %w", *p)
	}
	return nil
}

// blockStatus reports a regular file's holes (SEEK_HOLE, SEEK_DATA); a
// device is all data.
func (d *rawDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	r := extentRun{fn: fn}
	end := int64(lba+count) * BlockSize
	pos := int64(lba) * BlockSize
	if d.device {
		r.add(lba, count, false)
		r.done()
		return nil
	}
	for pos < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(d.fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = end // a hole to the end of the file
		} else if err != nil {
			return fmt.Errorf("raw SEEK_DATA: %w", err)
		}
		data = min(max(data, pos), end)
		// Holes and data are reported in whole blocks: a block with any
		// data counts as data.
		holeEnd := data / BlockSize * BlockSize
		if holeEnd > pos && !r.add(uint64(pos/BlockSize), uint64((holeEnd-pos)/BlockSize), true) {
			return nil
		}
		pos = max(pos, holeEnd)
		if pos >= end {
			break
		}
		hole, err := unix.Seek(d.fd, pos, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("raw SEEK_HOLE: %w", err)
		}
		dataEnd := min(end, (hole+BlockSize-1)/BlockSize*BlockSize)
		if dataEnd <= pos {
			dataEnd = pos + BlockSize
		}
		if !r.add(uint64(pos/BlockSize), uint64((dataEnd-pos)/BlockSize), false) {
			return nil
		}
		pos = dataEnd
	}
	r.done()
	return nil
}
