package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// vlogBytes returns the total size of the value log files in dir.
func vlogBytes(t *testing.T, dir string) int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// TestBadgerGCFreesDisk overwrites and trims a volume and checks that the
// store's GC goroutine then shrinks the value log. A small test never fills
// a memtable, so the compaction that finds the garbage is the one Close
// does (CompactL0OnClose); a busy store compacts as memtables fill.
func TestBadgerGCFreesDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := BadgerOptions{ValueLogFileSize: 1 << 20, GCInterval: -1}
	s := openBadger(t, dir, opts)
	v := mustCreate(t, s, "gc", 2048*BlockSize)
	for round := range 3 { // 3 x 8 MiB, two thirds garbage
		for lba := uint64(0); lba < 2048; lba += 256 {
			mustWrite(t, v, lba, patternBlocks(lba, 256, uint64(round+1)))
		}
	}
	if err := v.Trim(ctx, 0, 1024); err != nil { // and half of the rest
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before := vlogBytes(t, dir)

	opts.GCInterval = 20 * time.Millisecond
	s = openBadger(t, dir, opts)
	defer s.Close()
	deadline := time.Now().Add(60 * time.Second)
	for vlogBytes(t, dir) > before/2 {
		if time.Now().After(deadline) {
			t.Fatalf("value log still %d bytes (was %d) after GC", vlogBytes(t, dir), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("value log: %d bytes before GC, %d after (live data 4 MiB)", before, vlogBytes(t, dir))

	v, err := s.OpenVolume(ctx, "gc")
	if err != nil {
		t.Fatal(err)
	}
	want := patternBlocks(0, 2048, 3)
	clear(want[:1024*BlockSize])
	equalBlocks(t, "data after GC", 0, mustRead(t, v, 0, 2048), want)
}
