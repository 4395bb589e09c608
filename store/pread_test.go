package store

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPread checks pread and preadNoWait against the file's content with
// the data in the page cache, dropped from it (POSIX_FADV_DONTNEED), held
// in part, in a hole and past the end of the file.
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
	if _, err := f.WriteAt(want[:256<<10], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want[320<<10:], 320<<10); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	drop := func(off, n int64) {
		t.Helper()
		if err := unix.Fadvise(fd, off, n, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		off, n  int64
		prepare func()
	}{
		{"cached 4KiB", 8192, 4096, nil},
		{"cached 1MiB", 0, size, nil},
		{"uncached", 4096, 128 << 10, func() {
			drop(0, size)
			if preadNoWait(fd, make([]byte, 4096), 4096) {
				t.Fatal("preadNoWait read data dropped from the page cache")
			}
		}},
		{"cached in part", 0, 512 << 10, func() { drop(64<<10, size) }},
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
				c.prepare()
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
	drop(0, size)
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
