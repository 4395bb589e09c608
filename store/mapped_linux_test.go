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
