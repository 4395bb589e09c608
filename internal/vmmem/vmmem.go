// Package vmmem makes the memory of a virtual machine behave as a
// long-running host's for the time of a benchmark (SteadyMemory).
package vmmem

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// reportingOrder is the virtio-balloon free page reporting's parameter:
// free blocks of 2^order pages and more are handed back to the host.
const reportingOrder = "/sys/module/page_reporting/parameters/page_reporting_order"

// SteadyMemory makes the memory of this machine behave as a long-running
// storage host's does, for the time of a benchmark: new page-cache pages
// and heap pages cost what allocating them costs, not a fault in the host.
//
// Why: in a virtual machine whose memory the host backs on first use (this
// one is PVM-backed; KVM guests without preallocated memory are the same),
// the guest's first write to a page costs a fault in the host, about 3 us
// per 4 KiB here. With free page reporting (virtio-balloon, on here with
// 2 MiB blocks and no delay) every page freed goes back to the host and
// pays it again on its next use. So a job that grows the page cache pays
// ~3 us per 4 KiB it writes into new pages: measured through rinit, 4 KiB
// copy-on-write writes (64 KiB of new page cache each) ran at 4.3-6k IOPS
// with copy_folio_from_iter_atomic, the copy into the new pages, 50 % of
// rtarget's profile, and at 29-35k with reporting stopped and the free
// memory touched; 1 MiB writes to a fresh volume at 0.42-0.65 against
// 1.26-1.36 GB/s. A storage host whose page cache has filled its memory
// takes new pages from the cache itself and never pays it.
//
// It stops the reporting (when the kernel has it and this process may
// change it) and writes once to all but reserve bytes of the free memory.
// restore puts the reporting back as it was; it is never nil.
func SteadyMemory(reserve int64, log *slog.Logger) (restore func(), err error) {
	restore = func() {}
	if old, err := os.ReadFile(reportingOrder); err == nil {
		if err := os.WriteFile(reportingOrder, []byte("11"), 0); err != nil {
			log.Warn("cannot stop the free page reporting: jobs that grow the page cache pay the host's faults", "err", err)
		} else {
			log.Info("free page reporting stopped for the benchmark", "order was", strings.TrimSpace(string(old)))
			restore = func() {
				if err := os.WriteFile(reportingOrder, old, 0); err != nil {
					log.Error("restore the free page reporting", "file", reportingOrder, "value", strings.TrimSpace(string(old)), "err", err)
				}
			}
		}
	}
	n, d, err := touchFreeMemory(reserve)
	if err != nil {
		restore()
		return func() {}, err
	}
	log.Info("touched the free memory", "MiB", n>>20, "took", d.Round(time.Millisecond))
	return restore, nil
}

// touchFreeMemory writes once to all but reserve bytes of the memory the
// kernel has free, and gives it back (see SteadyMemory).
//
// It returns how many bytes it touched and how long that took.
func touchFreeMemory(reserve int64) (int64, time.Duration, error) {
	free, err := memFree()
	if err != nil {
		return 0, 0, err
	}
	const chunk = 256 << 20
	start := time.Now()
	var maps [][]byte
	defer func() {
		for _, m := range maps {
			_ = unix.Munmap(m)
		}
	}()
	var touched int64
	for touched+chunk <= free-reserve {
		// MAP_POPULATE on a private writable mapping allocates every page
		// (a write fault each), which is what the first use costs.
		m, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE|unix.MAP_NORESERVE)
		if err != nil {
			return touched, time.Since(start), fmt.Errorf("touch free memory: mmap after %d MiB: %w", touched>>20, err)
		}
		maps = append(maps, m)
		touched += chunk
	}
	return touched, time.Since(start), nil
}

// memFree is MemFree of /proc/meminfo, in bytes.
func memFree() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("free memory: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemFree:" {
			kib, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("free memory: %q: %w", s.Text(), err)
			}
			return kib << 10, nil
		}
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("free memory: %w", err)
	}
	return 0, errors.New("free memory: no MemFree in /proc/meminfo")
}
