package store

import (
	"context"
	"testing"
)

// TestPageOutValueLogs pages out the value log of a store holding data and
// checks that the mappings were found and the data still reads back.
func TestPageOutValueLogs(t *testing.T) {
	s := openBadger(t, t.TempDir(), BadgerOptions{MappedBudget: -1})
	defer s.Close()
	v := mustCreate(t, s, "p", 1024*BlockSize)
	defer v.Close()
	data := patternBlocks(0, 1024, 3)
	mustWrite(t, v, 0, data)
	if err := v.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := badgerOf(s)
	b.mapMu.Lock()
	n, err := pageOutValueLogs(b.dir)
	b.mapMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no value log mapping found in /proc/self/maps")
	}
	equalBlocks(t, "after page-out", 0, mustRead(t, v, 0, 1024), data)
	if rss, err := mappedFileRSS(); err != nil || rss <= 0 {
		t.Fatalf("mappedFileRSS = %d, %v", rss, err)
	}
}
