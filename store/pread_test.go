package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPread checks pread and preadNoWait against the file's content with
// the data in the page cache, dropped from it (POSIX_FADV_DONTNEED), held
// in part, in a hole and past the end of the file, below and above
// rawReadMax.
func TestPread(t *testing.T) {
	const size = 1 << 20
	path := filepath.Join(t.TempDir(), "f")
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	clear(want[256<<10 : 320<<10]) // a hole
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Written 4 KiB at a time, so that the page cache holds it in 4 KiB
	// folios and drops exactly the ranges asked.
	for off := 0; off < size; off += 4096 {
		if off >= 256<<10 && off < 320<<10 {
			continue
		}
		if _, err := f.WriteAt(want[off:off+4096], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	// No readahead: a read caches what it asked for and no more, so that
	// the ranges below are cached or not as the test says.
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	// drop asks the kernel to drop n bytes at off from the page cache until
	// cachestat(2) finds none of them (a folio still in a per-CPU batch
	// stays at the first try). A probe by a no-wait read would not do: a
	// miss starts reading the page in.
	drop := func(t *testing.T, off, n int64) {
		t.Helper()
		for try := 0; ; try++ {
			if err := unix.Fadvise(fd, off, n, unix.FADV_DONTNEED); err != nil {
				t.Fatal(err)
			}
			var st unix.Cachestat_t
			err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0)
			switch {
			case errors.Is(err, unix.ENOSYS):
				t.Skip("no cachestat(2) (Linux 6.5) to tell what the page cache holds")
			case err != nil:
				t.Fatal(err)
			case st.Cache == 0:
				return
			case try == 100:
				t.Fatalf("%d of %d bytes at %d still cached after 100 tries of POSIX_FADV_DONTNEED", st.Cache*4096, n, off)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, c := range []struct {
		name    string
		off, n  int64
		prepare func(t *testing.T)
	}{
		{"cached 4KiB", 8192, 4096, nil},
		{"cached 1MiB", 0, size, nil},
		{"uncached", 4096, 128 << 10, func(t *testing.T) {
			drop(t, 0, size)
		}},
		{"cached in part", 0, 64 << 10, func(t *testing.T) {
			if err := pread(fd, make([]byte, 32<<10), 0); err != nil {
				t.Fatal(err)
			}
			drop(t, 32<<10, size)
			// The no-wait read returns what is cached from the start: at
			// least the 32 KiB (a miss starts reading the rest in, which a
			// fast disk may finish before the call returns).
			buf := make([]byte, 64<<10)
			n, err := preadv2NoWait(fd, buf, 0)
			if err != nil || n < 32<<10 || n > 64<<10 || !bytes.Equal(buf[:n], want[:n]) {
				t.Fatalf("preadv2NoWait of 64 KiB, 32 KiB cached: %d, %v (data right: %v)", n, err,
					n >= 0 && n <= len(buf) && bytes.Equal(buf[:n], want[:n]))
			}
		}},
		{"cached in part, large", 0, 512 << 10, func(t *testing.T) { drop(t, 64<<10, size) }},
		{"hole", 256 << 10, 64 << 10, nil},
		{"across the end", size - 4096, 8192, nil},
		{"past the end", size + 4096, 4096, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			exp := make([]byte, c.n)
			if c.off < size {
				copy(exp, want[c.off:])
			}
			if c.prepare != nil {
				c.prepare(t)
			}
			got := bytes.Repeat([]byte{0xa5}, int(c.n))
			if err := pread(fd, got, c.off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, exp) {
				t.Fatalf("pread at %d+%d: wrong data", c.off, c.n)
			}
			// The data is cached now (or past the end): preadNoWait reads
			// it whole.
			got = bytes.Repeat([]byte{0xa5}, int(c.n))
			if c.off+c.n <= size || c.off >= size {
				if !preadNoWait(fd, got, c.off) {
					t.Fatalf("preadNoWait at %d+%d after pread: not read", c.off, c.n)
				}
				if !bytes.Equal(got, exp) {
					t.Fatalf("preadNoWait at %d+%d: wrong data", c.off, c.n)
				}
			}
		})
	}
	// preadNoWait never reports a partial read as done.
	drop(t, 0, size)
	got := make([]byte, size)
	if err := pread(fd, got[:4096], 0); err != nil {
		t.Fatal(err)
	}
	if preadNoWait(fd, got, 0) {
		// The kernel may have read ahead all of it; then it must be right.
		if !bytes.Equal(got, want) {
			t.Fatal("preadNoWait of a file read ahead: wrong data")
		}
	}
	if preadNoWait(-1, got[:4096], 0) {
		t.Fatal("preadNoWait on a closed descriptor reported a read")
	}
	if err := pread(-1, got[:4096], 0); err == nil {
		t.Fatal("pread on a closed descriptor: no error")
	}
}
