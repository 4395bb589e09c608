package store

import (
	"context"
	"testing"
)

// TestPageOutValueLogs pages out the value log of a store holding data in
// several value log files (1 MiB each, 4 MiB written) and checks that the
// finished files' mappings were found and advised, the newest left alone,
// and the data still reads back.
func TestPageOutValueLogs(t *testing.T) {
	s := openBadger(t, t.TempDir(), BadgerOptions{MappedBudget: -1, ValueLogFileSize: 1 << 20})
	defer s.Close()
	v := mustCreate(t, s, "p", 1024*BlockSize)
	defer v.Close()
	data := patternBlocks(0, 1024, 3)
	for i := 0; i < 1024; i += 64 { // separate writes: badger starts a new file between them
		mustWrite(t, v, uint64(i), data[i*BlockSize:(i+64)*BlockSize])
	}
	if err := v.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := badgerOf(s)
	b.mapMu.Lock()
	n, err := pageOutValueLogs(b.dir, false)
	b.mapMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d finished value log mappings advised, want at least 2 (4 MiB in 1 MiB files)", n)
	}
	equalBlocks(t, "after page-out", 0, mustRead(t, v, 0, 1024), data)
	// The eviction used while value log GC runs: no lock, same files.
	if n2, err := pageOutValueLogs(b.dir, true); err != nil || n2 != n {
		t.Fatalf("evicting: %d mappings, %v; want %d", n2, err, n)
	}
	equalBlocks(t, "after eviction", 0, mustRead(t, v, 0, 1024), data)
	if rss, err := mappedFileRSS(); err != nil || rss <= 0 {
		t.Fatalf("mappedFileRSS = %d, %v", rss, err)
	}
}

// TestRSSProbe: the budget checks' reader of RssFile agrees with a fresh
// read of /proc/self/status, allocates nothing, keeps working on reuse and
// after close, and the parser refuses what is not an RssFile line.
func TestRSSProbe(t *testing.T) {
	p := newRSSProbe()
	defer p.close()
	for range 3 {
		got, err := p.fileRSS()
		if err != nil {
			t.Fatal(err)
		}
		want, err := mappedFileRSS()
		if err != nil {
			t.Fatal(err)
		}
		if d := got - want; got <= 0 || d < -4<<20 || d > 4<<20 {
			t.Fatalf("probe RssFile %d, /proc/self/status %d", got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { p.fileRSS() }); a != 0 {
		t.Errorf("%.1f allocations per probe read, want 0", a)
	}
	p.close()
	if v, err := p.fileRSS(); err != nil || v <= 0 {
		t.Fatalf("after close: %d, %v", v, err)
	}
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"Name:\tx\nRssAnon:\t  10 kB\nRssFile:\t  1234 kB\nRssShmem:\t0 kB\n", 1234 << 10, true},
		{"Name:\tx\nRssFile:\t0 kB\n", 0, true},
		{"Name:\tx\nRssFile:\t kB\n", 0, false},
		{"Name:\tx\nRssFile:\t12 MB\n", 0, false},
		{"Name:\tx\nXRssFile:\t12 kB\n", 0, false},
		{"", 0, false},
	} {
		v, err := parseRssFile([]byte(c.in))
		if (err == nil) != c.ok || v != c.want {
			t.Errorf("parseRssFile(%q) = %d, %v; want %d, ok %v", c.in, v, err, c.want, c.ok)
		}
	}
}
