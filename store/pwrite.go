package store

import (
	"errors"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The data files' writes, and those of raw volumes (raw.go). A write system call of at most rawWriteMax
// bytes (the whole request's length) is made without telling the Go
// scheduler (syscall.RawSyscall6), as the reads of cached data are
// (pread.go), when no other write of this process is under way on the same
// file (dataFile.writers counts them, hole punches, allocations ahead and
// the write-outs of sync_file_range and fdatasync included).
//
// Why raw: a scheduler-visible system call costs its entry and exit, and
// one the runtime's monitor thread (sysmon) finds still running at its
// next tick has its P taken away and handed to another thread, which
// keeps sysmon waking every 20 us; after the process went idle, the first
// such call wakes sysmon too. A raw call is none of that, but keeps its P
// for as long as the kernel takes.
//
// Why alone: a buffered write holds the file's inode lock (i_rwsem,
// exclusive, on ext4 and XFS alike) for its whole length, as fallocate
// does, and a write-out allocating the blocks of new data holds ext4's
// i_data_sem, which a write into new space takes too. A raw write that met
// one of ours in the kernel would sleep there holding its P; under contention the kernel's lock, which spins
// on a running owner, also hands over faster than a Go mutex. And a raw
// write that stalls anyway (rawStall: the kernel throttling a writer of
// too many dirty pages, a journal commit, reclaim, or just a busy CPU)
// makes the pool's writes scheduler-visible for a while (rawPauseMin,
// doubled for each stall that comes soon after the last pause, up to
// rawPauseMax: a kernel that keeps throttling costs one stalled P every
// 10 s at most).
//
// Measured through rinit, 4 KiB random writes at QD16 on a 2 GiB volume
// written in full (ext4), interleaved with the memory store, 4 rounds:
// scheduler-visible 23.3k, 23.0k, 24.1k, 23.8k IOPS and 21.2-22.6 us of
// rtarget CPU per write; raw when alone 22.3k, 25.3k, 26.2k, 30.5k and
// 13.0-16.8 us; the memory store 41.4k (its first round), 28.7k, 28.2k,
// 29.8k. Writes to a fresh volume did not change (4 rounds, 0.89-1.15x).
// Raw volumes (raw.go), 4 KiB random writes at QD16 on a 2 GiB image
// file, interleaved with the previous build, 4 rounds: 45.4k, 48.4k,
// 46.7k, 43.3k -> 48.7k, 49.6k, 47.4k, 52.3k IOPS, rtarget CPU per write
// 9.1-10.5 -> 6.5-7.6 us; at QD1 9.4k, 7.2k -> 10.1k, 9.5k IOPS.
// Raw writes made whatever else was under way (an earlier try) cut the
// CPU as much but served no more writes: at QD16 they queued on the inode
// lock asleep, each holding its P. Raw under a Go mutex served more
// through rinit but fewer in BenchmarkStoreVsFile, whose 16 writers made
// the mutex hand over at every write (4 KiB random writes 4.6-4.8 ->
// 6.3-6.6 us each).

// rawWriteMax bounds the writes made raw: larger ones copy long enough
// that the call's own cost is small next to the copy, and a raw call
// keeps its P meanwhile.
const rawWriteMax = 64 << 10

const (
	// rawStall is how long a raw write may take before it counts as
	// stalled: a 64 KiB write into the page cache takes tens of us.
	rawStall = time.Millisecond
	// rawPauseMin and rawPauseMax bound how long writes stay
	// scheduler-visible after a stall.
	rawPauseMin = 100 * time.Millisecond
	rawPauseMax = 10 * time.Second
)

// writeCall makes one write system call of src at pos of f; raw says that
// the whole write, of which src may be a piece, is small enough to be made
// raw (rawWriteMax).
func (p *dataPool) writeCall(f *dataFile, src []byte, pos int64, raw bool) (int, error) {
	return p.writeFd(f.fd, &f.writers, src, pos, raw)
}

// writeFd is writeCall on file descriptor fd, whose writes, fallocates
// and syncs under way writers counts: a data file's, or a raw volume's
// file (raw.go), which shares the pool's stall pause (a stall says the
// kernel or the machine is busy, whichever file it came from).
func (p *dataPool) writeFd(fd int, writers *atomic.Int32, src []byte, pos int64, raw bool) (int, error) {
	alone := writers.Add(1) == 1
	defer writers.Add(-1)
	if !raw || !alone || time.Since(p.clock) < time.Duration(p.rawOffUntil.Load()) {
		return unix.Pwrite(fd, src, pos)
	}
	start := time.Since(p.clock)
	n, err := pwriteRaw(fd, src, pos)
	if end := time.Since(p.clock); end-start > p.rawStall {
		p.rawStalled(end)
	}
	return n, err
}

// rawStalled makes writes scheduler-visible after a raw write that ended
// at now stalled: for rawPauseMin, or twice the last pause if this stall
// came within that pause's length after it ended, up to rawPauseMax.
func (p *dataPool) rawStalled(now time.Duration) {
	p.stallMu.Lock()
	defer p.stallMu.Unlock()
	p.rawStalls.Add(1)
	pause := time.Duration(rawPauseMin)
	if last := time.Duration(p.rawOffUntil.Load()); last != 0 && now < last+p.rawPause {
		pause = min(2*p.rawPause, rawPauseMax)
	}
	p.rawPause = pause
	p.rawOffUntil.Store(int64(now + pause))
}

// pwriteRaw is pwrite(fd, src, pos) made with syscall.RawSyscall6. Under
// the race detector it goes through unix.Pwrite, whose wrapper tells the
// detector that src was read, and so it does on 32-bit systems, whose
// pwrite64 takes the offset in two registers.
func pwriteRaw(fd int, src []byte, pos int64) (int, error) {
	if raceEnabled || len(src) == 0 || unsafe.Sizeof(uintptr(0)) < 8 {
		return unix.Pwrite(fd, src, pos)
	}
	r, _, e := syscall.RawSyscall6(unix.SYS_PWRITE64, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(src))),
		uintptr(len(src)), uintptr(pos), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// fallocate is unix.Fallocate on f, retried on EINTR; it counts as a
// write under way.
func (f *dataFile) fallocate(mode uint32, pos, n int64) error {
	f.writers.Add(1)
	defer f.writers.Add(-1)
	for {
		err := unix.Fallocate(f.fd, mode, pos, n)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
