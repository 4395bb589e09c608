package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4), which package syscall lacks.
const madvPageout = 21

// mappedFileRSS returns the file-backed resident memory of the process in
// bytes (RssFile of /proc/self/status).
func mappedFileRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return parseRssFile(b)
}

// rssProbe is mappedFileRSS for the budget checks, which reads make every
// 16 blocks: it keeps /proc/self/status open and reads it into its own
// buffer, one pread and no allocation (6 us instead of 31). Not for
// concurrent use (badgerBackend.checkMu); after close it falls back to
// mappedFileRSS.
type rssProbe struct {
	f   *os.File
	buf [4096]byte
}

func newRSSProbe() *rssProbe {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return &rssProbe{}
	}
	return &rssProbe{f: f}
}

func (p *rssProbe) fileRSS() (int64, error) {
	if p.f == nil {
		return mappedFileRSS()
	}
	n, err := p.f.ReadAt(p.buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return parseRssFile(p.buf[:n])
}

func (p *rssProbe) close() {
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
}

// parseRssFile finds "RssFile:   123 kB" in the text of /proc/PID/status.
func parseRssFile(b []byte) (int64, error) {
	i := bytes.Index(b, []byte("\nRssFile:"))
	if i < 0 {
		return 0, fmt.Errorf("no RssFile in /proc/self/status")
	}
	b = bytes.TrimLeft(b[i+len("\nRssFile:"):], " \t")
	kb, digits := int64(0), 0
	for ; digits < len(b) && b[digits] >= '0' && b[digits] <= '9'; digits++ {
		kb = kb*10 + int64(b[digits]-'0')
	}
	if digits == 0 || !bytes.HasPrefix(b[digits:], []byte(" kB")) {
		return 0, fmt.Errorf("malformed RssFile in /proc/self/status")
	}
	return kb << 10, nil
}

// pageOutValueLogs takes the pages of the finished value log files in dir
// (an absolute path without symlinks) that badger has mapped out of this
// process's RSS: written or read pages stay mapped, and counted in the RSS,
// until the kernel needs the memory. It returns how many mappings it
// advised. The caller must hold badgerBackend.mapMu, which keeps value log
// GC (the only deleter of value log files while the store is open) from
// running meanwhile.
//
// Every file but the newest is finished: badger neither writes nor remaps
// it again, and deletes it only in GC. Its pages are dropped from this
// process with MADV_DONTNEED, which on a shared file mapping leaves them
// in the page cache (dirty ones are written back as usual): a later read
// is a minor fault, not a disk read. The newest file is the one badger
// appends to, and grows and remaps (mremap) while it does, so its range may
// hold something else by the time the call runs, and MADV_DONTNEED there
// could zero an anonymous mapping that took its place: it is left alone.
// (MADV_PAGEOUT would be safe on any memory, but it evicts the pages from
// the page cache, and what was just written would then be read back from
// disk.) Its share of the RSS is bounded by the value log file size.
//
// With evict set it uses MADV_PAGEOUT instead, which is safe whatever the
// range holds by then (it only reclaims: anonymous pages keep their
// contents, file pages are written back first) and so needs no mapMu; it
// also drops the pages from the page cache, so a later read goes to the
// disk. The store uses it only while value log GC runs (see trim).
func pageOutValueLogs(dir string, evict bool) (int, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	type mapping struct {
		start, end uint64
		fid        uint64
		path       string
	}
	var maps []mapping
	newest := uint64(0)
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
		fid, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".vlog"), 10, 64)
		if err != nil {
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
		maps = append(maps, mapping{start, end, fid, path})
		newest = max(newest, fid)
	}
	err = sc.Err()
	f.Close()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range maps {
		if m.fid == newest {
			continue
		}
		advice := uintptr(syscall.MADV_DONTNEED)
		if evict {
			advice = madvPageout
		}
		_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), advice)
		if errno != 0 {
			return n, fmt.Errorf("madvise %s: %w", m.path, errno)
		}
		n++
	}
	return n, nil
}
