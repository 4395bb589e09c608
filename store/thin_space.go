package store

import (
	"errors"
	"fmt"
	"log/slog"
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
}

// Bounds of the default reserve: 2 % of the file system's size, at least
// 64 MiB (a badger memtable log is 16 MiB at the default memtable size,
// and a compaction writes new tables before it deletes the old ones), at
// most 1 GiB.
const (
	minSpaceReserve = 64 << 20
	maxSpaceReserve = 1 << 30
)

func newSpaceGuard(reserve int64, log *slog.Logger, dirs ...string) *spaceGuard {
	return &spaceGuard{dirs: dirs, reserve: reserve, log: log}
}

// refresh reads the free space; it reports the bytes above the reserve.
func (g *spaceGuard) refresh() (above int64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	free, reserve := int64(-1), g.reserve
	for _, d := range g.dirs {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return 0, fmt.Errorf("free space of %s: %w", d, err)
		}
		f := int64(st.Bavail) * st.Bsize
		if free < 0 || f < free {
			free = f
		}
		if g.reserve <= 0 {
			reserve = max(reserve, min(max(int64(st.Blocks)*st.Bsize/50, minSpaceReserve), maxSpaceReserve))
		}
	}
	above = free - reserve
	g.effective = reserve
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
