package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dataPool is the data files of a thin store: physical cluster p lives in
// file p>>fileShift at offset (p & (1<<fileShift - 1)) * clusterSize. Files
// are sparse; a free cluster is a hole (punched when freed). Cluster 0 of
// file 0 holds the header naming the store, and is never allocated.
type dataPool struct {
	dir       string
	cs        int64 // cluster size in bytes
	fileShift uint  // log2 of the clusters per file
	// xfs: the data files are on XFS, so writes go whole (no writeChunk
	// bound) and new clusters' blocks are allocated ahead (allocAhead).
	xfs bool

	// files holds the data files by index (nil until opened): a slice
	// never changed once stored, replaced under mu when a file is opened or
	// the pool closes. Every read and write loads it without taking mu,
	// which, shared by all the I/O of the store, was a point of contention
	// (2 % of the CPU of 4 KiB reads in BenchmarkStoreVsFile).
	mu    sync.Mutex
	files atomic.Pointer[[]*dataFile]

	// unflushed counts the bytes written into new clusters since the last
	// writeback was started; past writebackBytes, writeNew kicks the
	// writeback loop.
	unflushed  atomic.Int64
	kick       chan struct{}
	writebacks atomic.Uint64 // passes of the writeback loop so far

	space *spaceGuard // keeps the file system's last free space for the metadata

	// dirDirty: a data file was created since the directory's last
	// fsync. POSIX makes a new file's name durable only through an fsync
	// of its directory, which must come before the commit that maps
	// clusters into the file (sync does it first).
	dirDirty atomic.Bool

	// syncHook, when set (by tests only), runs as sync begins;
	// dirSyncHook runs before the directory's fsync, and its error fails
	// that fsync.
	syncHook    atomic.Pointer[func()]
	dirSyncHook atomic.Pointer[func() error]
}

type dataFile struct {
	fd    int
	dirty atomic.Bool // written since its last fdatasync

	// For allocAhead (XFS only): size is the file's size as last known
	// (at open, after writes into new space, truncate), the end of the
	// data written; preEnd is where the blocks allocated ahead end; preMu
	// serializes their allocation.
	size   atomic.Int64
	preEnd atomic.Int64
	preMu  sync.Mutex
}

// writebackBytes is how much data may be written into newly allocated
// clusters before the writeback of the data files is started
// (sync_file_range WRITE, in the background, like RocksDB's
// bytes_per_sync). In ext4's ordered mode every fsync on the file system,
// the metadata database's included, first writes out the data of the
// blocks allocated since the last journal commit: without an early start,
// a commit interval of writes into new space (a second at 1.4 GB/s) made
// the next one take as long, and a snapshot of one volume waited 264 ms
// for the writes another volume had just made. Overwrites in place are
// not counted: they allocate nothing, their writeback only costs the
// commit's own fdatasync, and starting it early cost 7-14 % of 4 KiB
// random write throughput (bench/store, 64 and 16 MiB).
const writebackBytes = 16 << 20

// dataFileBytes is the size a data file grows to before the next begins.
const dataFileBytes = 1 << 40

func newDataPool(dir string, cs, fileBytes int64, space *spaceGuard) *dataPool {
	if fileBytes == 0 {
		fileBytes = dataFileBytes
	}
	shift := uint(0)
	for int64(1)<<shift*cs < fileBytes {
		shift++
	}
	return &dataPool{dir: dir, cs: cs, fileShift: shift, xfs: onXFS(dir), kick: make(chan struct{}, 1), space: space}
}

func (p *dataPool) path(i int) string {
	return filepath.Join(p.dir, fmt.Sprintf("%06d.data", i))
}

// file returns data file i, opening (creating) it on first use.
func (p *dataPool) file(i int) (*dataFile, error) {
	if fs := p.openFiles(); i < len(fs) && fs[i] != nil {
		return fs[i], nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fs := p.openFiles()
	if i < len(fs) && fs[i] != nil {
		return fs[i], nil // opened meanwhile
	}
	fd, err := unix.Open(p.path(i), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		fd, err = unix.Open(p.path(i), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if err == nil {
			p.dirDirty.Store(true)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open data file: %w", &os.PathError{Op: "open", Path: p.path(i), Err: err})
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat data file: %w", &os.PathError{Op: "fstat", Path: p.path(i), Err: err})
	}
	f := &dataFile{fd: fd}
	f.size.Store(st.Size)
	fs = slices.Clone(fs)
	for len(fs) <= i {
		fs = append(fs, nil)
	}
	fs[i] = f
	p.files.Store(&fs)
	return f, nil
}

// locate returns the file and byte offset of physical cluster c plus off,
// and how many bytes from there lie in the same file.
func (p *dataPool) locate(c uint64, off int64) (*dataFile, int64, int64, error) {
	i := int(c >> p.fileShift)
	f, err := p.file(i)
	if err != nil {
		return nil, 0, 0, err
	}
	pos := int64(c&(1<<p.fileShift-1))*p.cs + off
	return f, pos, int64(1)<<p.fileShift*p.cs - pos, nil
}

// readAt fills dst from physical cluster c at byte off (dst may run into
// the following clusters of the same file).
func (p *dataPool) readAt(dst []byte, c uint64, off int64) error {
	f, pos, room, err := p.locate(c, off)
	if err != nil {
		return err
	}
	if int64(len(dst)) > room {
		return fmt.Errorf("read of %d bytes at cluster %d crosses a data file: %w", len(dst), c, ErrInvalid)
	}
	if err := pread(f.fd, dst, pos); err != nil {
		return fmt.Errorf("read data file %d at %d: %w", c>>p.fileShift, pos, err)
	}
	return nil
}

// tryReadAt is readAt for data in the page cache only: it reports false
// (dst holds anything) when the read would wait for the disk or fails.
func (p *dataPool) tryReadAt(dst []byte, c uint64, off int64) bool {
	f, pos, room, err := p.locate(c, off)
	if err != nil || int64(len(dst)) > room {
		return false
	}
	return preadNoWait(f.fd, dst, pos)
}

// writeAt stores src at physical cluster c, byte off: an overwrite in a
// cluster already allocated.
func (p *dataPool) writeAt(src []byte, c uint64, off int64) error {
	f, pos, err := p.locateWrite(len(src), c, off)
	if err != nil {
		return err
	}
	if err := p.space.inPlace(f.fd, pos, int64(len(src))); err != nil {
		return fmt.Errorf("cluster %d: %w", c, err)
	}
	return p.pwrite(f, src, pos, c)
}

// writeNew is writeAt for a cluster just allocated: its bytes take new
// space, and count toward the next start of writeback.
func (p *dataPool) writeNew(src []byte, c uint64, off int64) error {
	f, pos, err := p.locateWrite(len(src), c, off)
	if err != nil {
		return err
	}
	if err := p.space.take(int64(len(src))); err != nil {
		return fmt.Errorf("cluster %d: %w", c, err)
	}
	end := pos + int64(len(src))
	if p.xfs {
		p.allocAhead(f, pos, end)
	}
	if err := p.pwrite(f, src, pos, c); err != nil {
		return err
	}
	if p.xfs {
		for size := f.size.Load(); end > size && !f.size.CompareAndSwap(size, end); size = f.size.Load() {
		}
	}
	if p.unflushed.Add(int64(len(src))) >= writebackBytes {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// locateWrite is locate for a write of n bytes, which must stay in one
// data file.
func (p *dataPool) locateWrite(n int, c uint64, off int64) (*dataFile, int64, error) {
	f, pos, room, err := p.locate(c, off)
	if err != nil {
		return nil, 0, err
	}
	if int64(n) > room {
		return nil, 0, fmt.Errorf("write of %d bytes at cluster %d crosses a data file: %w", n, c, ErrInvalid)
	}
	return f, pos, nil
}

// pwrite writes src at pos of f (cluster c, for errors).
func (p *dataPool) pwrite(f *dataFile, src []byte, pos int64, c uint64) error {
	// Pieces of at most writeChunk (see there), unless the page cache holds
	// every page of the range already: a write makes no new folio then,
	// and one call does it all.
	whole := p.xfs || len(src) <= writeChunk || cached(f.fd, pos, int64(len(src)))
	for len(src) > 0 {
		k := int64(len(src))
		if !whole {
			k = min(k, writeChunk-pos%writeChunk)
		}
		n, err := unix.Pwrite(f.fd, src[:k], pos)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("write data file %d at %d: %w", c>>p.fileShift, pos, noSpace(err))
		}
		src, pos = src[n:], pos+int64(n)
	}
	f.dirty.Store(true)
	return nil
}

// writeback starts the writeback of every data file's dirty pages each
// time writeNew kicks it, until ctx ends. It only starts it: durability is
// still sync's fdatasync, which then finds little left to write.
func (p *dataPool) writeback(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.unflushed.Store(0)
		p.writebacks.Add(1)
		for _, f := range p.openFiles() {
			if f != nil && f.dirty.Load() {
				// An error here only means the pages wait for the next
				// fdatasync, which reports it.
				_ = unix.SyncFileRange(f.fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			}
		}
	}
}

// preallocStep is how much of a data file allocAhead allocates at a time.
const preallocStep = 1 << 30

// allocAhead allocates the blocks of f from its end to the preallocStep
// boundary after end (fallocate, unwritten extents that read as zeros,
// the file's size unchanged), for a write into new space at [pos, end)
// at or past the file's end, unless an earlier call did. A write inside
// the file (a cluster freed and allocated again) allocates nothing
// ahead: that would take back the space of the freed clusters around it.
//
// New clusters come mostly in ascending order, and a 4 KiB write into one
// is an extent of its own: on XFS each then cost a search of the
// free-space B-trees (at the write, or at writeback), which allocating a
// whole step at once makes one per GiB. Through rinit, 4 KiB writes to a
// fresh volume: 25.5-26.1k -> 39.7-43.5k IOPS (ext4 43.6-44.2k ->
// 41.3-48.5k: not used there). A step is allocated only while the file
// system has twice its size above the store's reserve, so it never eats
// into the reserve. Whether it is allocated, skipped for space or fails,
// the writes up to its end do not ask again (they allocate their own
// blocks if need be): one statfs and one fallocate per step at most.
func (p *dataPool) allocAhead(f *dataFile, pos, end int64) {
	if end <= f.preEnd.Load() || pos < f.size.Load() {
		return
	}
	f.preMu.Lock()
	defer f.preMu.Unlock()
	if end <= f.preEnd.Load() {
		return
	}
	from := max(f.size.Load(), f.preEnd.Load())
	to := min((end+preallocStep-1)/preallocStep*preallocStep, int64(1)<<p.fileShift*p.cs)
	if above, err := p.space.refresh(); err == nil && above >= 2*preallocStep {
		_ = f.fallocate(unix.FALLOC_FL_KEEP_SIZE, from, to-from)
	}
	f.preEnd.Store(to)
}

// writeChunk bounds a pwrite to the data files, except on XFS. The page
// cache makes a buffered write's new pages into one folio as large as the
// write allows (up to 2 MiB), and ext4 walks every block of a folio on
// each later write into it: a 4 KiB random write into data written with
// 1 MiB requests spent two thirds of rtarget's CPU in
// ext4_block_write_begin (14k IOPS through rinit, half the memory
// store's). Measured in BenchmarkStoreVsFile (CPU per op): 4 KiB random
// writes 4.4, 5.4, 7.1 us and 1 MiB sequential reads 258, 217, 162 us
// with chunks of 4, 16 and 64 KiB; 64 KiB, the cluster size, keeps large
// requests cheap.
//
// XFS writes through iomap, which keeps a folio's per-block state in a
// bitmap and walks no buffer heads, so large folios cost a small write
// nothing there, and they make the page-cache lookup of every read
// cheaper (bench/README.md, "The store alone, 4 KiB reads"). Through
// rinit, on a 2 GiB volume written in full with 1 MiB requests, writes
// left whole against 64 KiB pieces: 4 KiB random reads at QD16 51.2-51.6k
// -> 56.7-61.1k IOPS, random writes 49.5-51.6k -> 56.1-58.4k.
const writeChunk = 64 << 10

// cached reports whether the page cache holds every page of the n bytes
// at pos of fd (cachestat, Linux 6.5; false where it fails). It does not
// wait for I/O, so it is made without telling the scheduler, as
// preadv2NoWait is.
//
// Through rinit this spares a 1 MiB overwrite 15 of its 16 calls; in
// BenchmarkStoreVsFile (1 MiB sequential writes at QD4 on a volume written
// in full, against the plain file written in 64 KiB pieces, so both are
// cached in 64 KiB folios) the store went from 0.78-0.86x the file to
// 0.86-1.03x.
func cached(fd int, pos, n int64) bool {
	page := int64(unix.Getpagesize()) // cachestat counts pages
	first, last := pos/page, (pos+n-1)/page
	r := unix.CachestatRange{Off: uint64(first * page), Len: uint64((last - first + 1) * page)}
	var st unix.Cachestat_t
	_, _, e := syscall.RawSyscall6(unix.SYS_CACHESTAT, uintptr(fd), uintptr(unsafe.Pointer(&r)),
		uintptr(unsafe.Pointer(&st)), 0, 0, 0)
	return e == 0 && st.Cache == uint64(last-first+1)
}

// onXFS reports whether dir is on XFS (false when it cannot be told): the
// data files are then written without writeChunk's bound, and their new
// clusters' blocks allocated ahead (allocAhead).
func onXFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.XFS_SUPER_MAGIC
}

// punch makes n bytes at physical cluster c, byte off, a hole: they read as
// zeros and take no space.
func (p *dataPool) punch(c uint64, off, n int64) error {
	f, pos, room, err := p.locate(c, off)
	if err != nil {
		return err
	}
	if n > room {
		return fmt.Errorf("punch of %d bytes at cluster %d crosses a data file: %w", n, c, ErrInvalid)
	}
	if err := f.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, pos, n); err != nil {
		return fmt.Errorf("punch data file %d at %d (%d bytes): %w", c>>p.fileShift, pos, n, err)
	}
	f.dirty.Store(true)
	return nil
}

// punchClusters punches whole clusters [start, end), one call per file.
func (p *dataPool) punchClusters(start, end uint64) error {
	for start < end {
		next := min(end, (start>>p.fileShift+1)<<p.fileShift)
		if err := p.punch(start, 0, int64(next-start)*p.cs); err != nil {
			return err
		}
		start = next
	}
	return nil
}

// openFiles returns the data files opened so far by index (nil where a
// file is not open); the slice is never changed.
func (p *dataPool) openFiles() []*dataFile {
	if fs := p.files.Load(); fs != nil {
		return *fs
	}
	return nil
}

// sync fdatasyncs every file written since its last sync. It reports
// whether any was.
func (p *dataPool) sync() (bool, error) {
	if h := p.syncHook.Load(); h != nil {
		(*h)()
	}
	synced := false
	if p.dirDirty.Swap(false) {
		if err := p.syncDir(); err != nil {
			p.dirDirty.Store(true)
			return false, err
		}
		synced = true
	}
	for i, f := range p.openFiles() {
		if f == nil || !f.dirty.Swap(false) {
			continue
		}
		synced = true
		err := unix.Fdatasync(f.fd)
		if err != nil {
			f.dirty.Store(true)
			return synced, fmt.Errorf("fdatasync data file %d: %w", i, err)
		}
	}
	return synced, nil
}

// syncDir fsyncs the data files' directory.
func (p *dataPool) syncDir() error {
	if h := p.dirSyncHook.Load(); h != nil {
		if err := (*h)(); err != nil {
			return fmt.Errorf("sync %s: %w", p.dir, err)
		}
	}
	return fsyncPath(p.dir)
}

// truncate cuts the data files to high clusters: what lies beyond was
// written by allocations that were never committed.
func (p *dataPool) truncate(high uint64) error {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return fmt.Errorf("data files: %w", err)
	}
	for _, e := range entries {
		var i int
		name := e.Name()
		if len(name) != len("000000.data") || filepath.Ext(name) != ".data" {
			continue
		}
		if i, err = strconv.Atoi(name[:6]); err != nil {
			continue
		}
		first := uint64(i) << p.fileShift
		path := filepath.Join(p.dir, name)
		if high <= first && i > 0 {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("data files: %w", err)
			}
			continue
		}
		size := int64(min(high-first, uint64(1)<<p.fileShift)) * p.cs
		f, err := p.file(i)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(f.fd, &st); err != nil {
			return fmt.Errorf("data files: stat %s: %w", path, err)
		}
		if st.Size > size {
			if err := unix.Ftruncate(f.fd, size); err != nil {
				return fmt.Errorf("data files: truncate %s: %w", path, err)
			}
			f.size.Store(size)
			f.dirty.Store(true)
		}
	}
	return fsyncPath(p.dir)
}

// allocatedBytes returns the bytes the data files occupy on disk.
func (p *dataPool) allocatedBytes() int64 {
	p.mu.Lock() // no close meanwhile
	defer p.mu.Unlock()
	var n int64
	for _, f := range p.openFiles() {
		var st unix.Stat_t
		if f != nil && unix.Fstat(f.fd, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

func (p *dataPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for i, f := range p.openFiles() {
		if f != nil {
			if err := unix.Close(f.fd); err != nil {
				errs = append(errs, fmt.Errorf("close data file %d: %w", i, err))
			}
		}
	}
	p.files.Store(nil)
	return errors.Join(errs...)
}
