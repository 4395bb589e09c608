package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// spaceGuard keeps the thin store's data writes from taking the last free
// space of the file system under it, which badger needs: badger writes
// its write-ahead log through a memory map of a sparse file, so when a
// page of it finds no free block the process dies of SIGBUS (measured: a
// 1 GiB volume written in full on a 230 MiB file system killed rtarget at
// the next commit). A thin pool over-commits by design, so running out of
// space is an operating condition, not a crash: past the reserve, a write
// that needs new space fails with ErrNoSpace, and metadata (commits,
// snapshots, volume changes) still has the reserve to work in.
//
// The free space is read with statfs, not on every write: writes draw
// their bytes from a budget, half of what the last statfs found above the
// reserve, and an empty budget reads it again (so it is read more often
// the closer the file system is to the reserve); the store's maintenance
// loop reads it every second too, which notices other writers of the file
// system and space given back by trims and deletes.
type spaceGuard struct {
	dirs    []string // data and metadata directories: the least free counts
	reserve int64    // bytes kept free; <= 0: from the file system's size
	log     *slog.Logger

	budget atomic.Int64 // bytes writes may still take before the next statfs
	low    atomic.Bool  // the last statfs found at most the reserve free

	mu        sync.Mutex // one statfs at a time
	effective int64      // the reserve the last statfs worked with (mu)
	above     int64      // bytes above it the last statfs found (mu)

	// The ballast: space of the reserve the store owns, so that another
	// process filling the file system cannot take it. A reserve is only
	// what the store's own writes leave free; the ballast is a file holding
	// allocated blocks, deleted (its blocks given to badger) when the free
	// space falls to a quarter of the reserve or to the floor, and
	// allocated again once the file system has room for it twice over
	// (maintenance loop).
	ballast     string // path of the ballast file
	ballastHeld int64  // bytes it holds on disk (mu)
	noBallast   bool   // the file system cannot allocate one (mu)
	released    bool   // the ballast was given to the metadata (mu)

	// floor is the free space below which metadata changes that add to
	// the database fail (metaRoom): room for badger to flush a full
	// memtable into a table. Commits of the write batch, deletes and
	// rollbacks, which give space back, still go on.
	floor int64
	free  int64 // what the last statfs found free (mu)
}

// Bounds of the default reserve: 2 % of the file system's size, at least
// 64 MiB (a badger memtable log is 16 MiB at the default memtable size,
// and a compaction writes new tables before it deletes the old ones), at
// most 1 GiB.
const (
	minSpaceReserve = 64 << 20
	maxSpaceReserve = 1 << 30
	// maxBallast bounds the ballast (half the reserve otherwise): two
	// memtable logs of 16 MiB and the tables their flush writes.
	maxBallast = 64 << 20
)

// newSpaceGuard guards the file system of dirs, with the ballast file at
// ballast (it takes over one left by an earlier run) and metadata growth
// stopped below floor bytes free.
func newSpaceGuard(reserve, floor int64, log *slog.Logger, ballast string, dirs ...string) *spaceGuard {
	g := &spaceGuard{dirs: dirs, reserve: reserve, floor: floor, log: log, ballast: ballast}
	var st unix.Stat_t
	if unix.Stat(ballast, &st) == nil {
		g.ballastHeld = st.Blocks * 512
	}
	return g
}

// ballastSize is the ballast's size for a reserve.
func ballastSize(reserve int64) int64 { return min(reserve/2, maxBallast) &^ (1<<20 - 1) }

// statfs returns the least free space of the guarded directories and the
// reserve that goes with it.
func (g *spaceGuard) statfs() (free, reserve int64, err error) {
	free, reserve = -1, g.reserve
	for _, d := range g.dirs {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return 0, 0, fmt.Errorf("free space of %s: %w", d, err)
		}
		f := int64(st.Bavail) * int64(st.Bsize)
		if free < 0 || f < free {
			free = f
		}
		if g.reserve <= 0 {
			reserve = max(reserve, min(max(int64(st.Blocks)*int64(st.Bsize)/50, minSpaceReserve), maxSpaceReserve))
		}
	}
	return free, reserve, nil
}

// refresh reads the free space; it reports the bytes above the reserve.
// Free space down to a quarter of the reserve, or to the floor, means
// someone else is filling the file system (the store's own writes stop at
// the reserve): the ballast goes, and its blocks are free for badger.
func (g *spaceGuard) refresh() (above int64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	free, reserve, err := g.statfs()
	if err != nil {
		return 0, err
	}
	if g.ballastHeld > 0 && free <= max(reserve/4, g.floor) {
		if err := os.Remove(g.ballast); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("release the ballast: %w", err)
		}
		g.log.Warn("the file system of the store is almost full: released the space kept for the metadata",
			"data", g.dirs[0], "free_bytes", free, "reserve_bytes", reserve, "released_bytes", g.ballastHeld)
		g.ballastHeld, g.released = 0, true
		if free, reserve, err = g.statfs(); err != nil {
			return 0, err
		}
	}
	above = free - reserve
	g.effective, g.above, g.free = reserve, above, free
	g.budget.Store(max(above/2, 0))
	// Hysteresis: full at the reserve (or when a write was refused), free
	// again only with a sixteenth of the reserve above it, so that a file
	// system hovering at the reserve does not flap.
	switch {
	case above <= 0:
		g.setLow(true, free, reserve)
	case above >= reserve/16:
		g.setLow(false, free, reserve)
	}
	return above, nil
}

// beforeMeta runs before each metadata transaction: badger's log takes new
// blocks through a memory map, where a full file system is fatal, so the
// ballast goes first if someone else has filled it since the last statfs.
// An error of statfs leaves things as they were: the caller's own write
// reports the file system's state.
func (g *spaceGuard) beforeMeta() { g.refresh() }

// metaRoom reports whether a metadata change that adds to the database
// may go ahead: on a file system filled below the floor it fails with
// ErrNoSpace, where badger's next new page could have killed the process.
func (g *spaceGuard) metaRoom() error {
	if _, err := g.refresh(); err != nil {
		return err
	}
	g.mu.Lock()
	free := g.free
	g.mu.Unlock()
	if free < g.floor {
		return fmt.Errorf("%w (the file system has %d bytes free, the metadata keeps %d: "+
			"volumes, snapshots and clones are made again once space is freed)", ErrNoSpace, free, g.floor)
	}
	return nil
}

// keepBallast allocates the ballast, or the part of it missing, when the
// last statfs found room for it twice over above the reserve. The store
// calls it at open and from its maintenance loop, never on the data path.
func (g *spaceGuard) keepBallast() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	want := ballastSize(g.effective)
	missing := want - g.ballastHeld
	if missing <= 0 || g.above < 2*missing || g.noBallast {
		return nil
	}
	fd, err := unix.Open(g.ballast, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("ballast: %w", err)
	}
	defer unix.Close(fd)
	err = fallocate(fd, 0, 0, want)
	if errors.Is(err, unix.EOPNOTSUPP) {
		g.noBallast = true
		g.log.Info("no space kept for the metadata: the file system cannot allocate without writing",
			"data", g.dirs[0])
		return nil
	}
	if err != nil {
		// ENOSPC may leave some blocks allocated: count what is there.
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			g.ballastHeld = st.Blocks * 512
		}
		return fmt.Errorf("ballast of %d bytes: %w", want, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("ballast: %w", err)
	}
	switch {
	case g.released:
		// The counterpart of the release's warning.
		g.log.Info("space kept for the metadata again", "data", g.dirs[0], "ballast_bytes", want)
		g.released = false
	case g.ballastHeld == 0:
		g.log.Debug("space kept for the metadata", "data", g.dirs[0], "ballast_bytes", want)
	}
	g.ballastHeld = want
	g.above -= missing
	g.budget.Store(max(g.above/2, 0))
	return nil
}

// setLow records whether the file system is at the store's reserve, and
// says so when that changes.
func (g *spaceGuard) setLow(low bool, free, reserve int64) {
	if g.low.Swap(low) == low {
		return
	}
	if low {
		g.log.Warn("the file system of the store is full: writes that need new space fail until space is freed",
			"data", g.dirs[0], "free_bytes", free, "reserve_bytes", reserve)
	} else {
		g.log.Info("the file system of the store has free space again", "data", g.dirs[0], "free_bytes", free,
			"reserve_bytes", reserve)
	}
}

// take accounts for n bytes of new space about to be written; it fails
// with ErrNoSpace when the file system has no more than the reserve free.
func (g *spaceGuard) take(n int64) error {
	if !g.low.Load() && g.budget.Add(-n) >= 0 {
		return nil
	}
	above, err := g.refresh()
	if err != nil {
		return err
	}
	if above < n {
		g.mu.Lock()
		g.setLow(true, above+g.effective, g.effective)
		g.mu.Unlock()
		return fmt.Errorf("%w (the file system is at the store's reserve)", ErrNoSpace)
	}
	g.budget.Add(-n)
	return nil
}

// inPlace checks an overwrite of n bytes at pos of data file fd: it takes
// no space unless it fills holes (the unwritten parts of a cluster), so
// when the file system is at its reserve it goes through only where every
// byte of it is data already.
func (g *spaceGuard) inPlace(fd int, pos, n int64) error {
	if !g.low.Load() {
		// Counted as new space: its holes are not known, and an empty
		// budget makes the next write read the free space again.
		if g.budget.Add(-n) < 0 {
			if _, err := g.refresh(); err != nil {
				return err
			}
		}
		if !g.low.Load() {
			return nil
		}
	}
	hole, err := unix.Seek(fd, pos, unix.SEEK_HOLE)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("find holes: %w", err)
	}
	if err == nil && hole < pos+n {
		return fmt.Errorf("%w (the file system is at the store's reserve)", ErrNoSpace)
	}
	return nil
}
