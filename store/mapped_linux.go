package store

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4+): reclaim the pages of a range.
// Unlike MADV_DONTNEED it never changes memory contents, whatever the range
// holds by the time the call runs, so racing with badger's own mmap and
// munmap calls is harmless.
const madvPageout = 21

// mappedFileRSS returns the file-backed resident memory of the process in
// bytes (RssFile of /proc/self/status).
func mappedFileRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("RssFile:")); ok {
			f := strings.Fields(string(rest))
			if len(f) != 2 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no RssFile in /proc/self/status")
}

// pageOutValueLogs asks the kernel to unmap, from this process, the pages
// of the value log files in dir (an absolute path without symlinks) that
// badger has mapped: written or read pages stay mapped, and counted in the
// RSS, until the kernel needs the memory. Dirty pages are written back as
// usual; the files are not affected. It returns how many mappings it
// advised.
func pageOutValueLogs(dir string) (int, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode   path (which may hold spaces)
		line := sc.Text()
		i := strings.IndexByte(line, '/')
		if i < 0 {
			continue
		}
		path := line[i:]
		if !strings.HasSuffix(path, ".vlog") || filepath.Dir(path) != dir {
			continue
		}
		addrs, _, _ := strings.Cut(line, " ")
		lo, hi, ok := strings.Cut(addrs, "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout)
		if errno != 0 {
			return n, fmt.Errorf("madvise %s: %w", path, errno)
		}
		n++
	}
	return n, sc.Err()
}
