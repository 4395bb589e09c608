package store

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rssDirEnv names the store directory for the child of TestBadgerRSS1GiB.
const rssDirEnv = "STORE_RSS_CHILD_DIR"

// procStatus returns the fields of /proc/self/status in KiB.
func procStatus() (map[string]int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := make(map[string]int64)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			m[name] = n
		}
	}
	return m, sc.Err()
}

// TestRSSChild writes a 1 GiB volume fully through WriteBlocks (128 KiB
// writes in scattered order, then a Flush), reads it back and checks it,
// sampling RSS, and prints the peaks.
// It runs only as the child of TestBadgerRSS1GiB, so its numbers are not
// mixed with other tests' memory.
func TestRSSChild(t *testing.T) {
	dir := os.Getenv(rssDirEnv)
	if dir == "" {
		t.Skip("child process of TestBadgerRSS1GiB")
	}
	ctx := context.Background()
	s, err := OpenBadger(dir, BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	const chunk = 32 // blocks per write
	v := mustCreate(t, s, "rss", size)

	var mu sync.Mutex
	peakAnon, peakFile := int64(0), int64(0)
	sample := func() {
		st, err := procStatus()
		if err != nil {
			return
		}
		mu.Lock()
		peakAnon = max(peakAnon, st["RssAnon"])
		peakFile = max(peakFile, st["RssFile"])
		mu.Unlock()
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				sample()
			}
		}
	}()

	start := time.Now()
	nchunks := uint64(size / BlockSize / chunk)
	buf := make([]byte, chunk*BlockSize)
	// A permutation of chunks (multiplicative, odd step) so the writes are
	// not sequential.
	for i := range nchunks {
		c := (i * 40503) % nchunks
		for b := range uint64(chunk) {
			fillBlock(buf[b*BlockSize:(b+1)*BlockSize], c*chunk+b, 1)
		}
		if err := v.WriteBlocks(ctx, c*chunk, buf, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)

	// Read it all back and check it: paged-out value log pages, written
	// back or not, must read as written.
	startRead := time.Now()
	rbuf := make([]byte, 256*BlockSize)
	for lba := uint64(0); lba < size/BlockSize; lba += 256 {
		if err := v.ReadBlocks(ctx, lba, rbuf); err != nil {
			t.Fatal(err)
		}
		for b := range uint64(256) {
			if tag, ok := blockTag(rbuf[b*BlockSize:(b+1)*BlockSize], lba+b); !ok || tag != 1 {
				t.Fatalf("block %d read back wrong (tag %d)", lba+b, tag)
			}
		}
	}
	readElapsed := time.Since(startRead)
	sample()
	close(stop)
	<-sampled
	st, err := procStatus()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	fmt.Printf("RSS-REPORT VmHWM=%d RssAnonPeak=%d RssAnon=%d RssFilePeak=%d RssFile=%d seconds=%.2f readseconds=%.2f\n",
		st["VmHWM"], peakAnon, st["RssAnon"], peakFile, st["RssFile"], elapsed.Seconds(), readElapsed.Seconds())
	mu.Unlock()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBadgerRSS1GiB measures the memory of writing a 1 GiB volume fully and
// reading it back, in a child process, and reports it: VmHWM (peak RSS),
// and the peaks of its anonymous (heap, memtables, caches) and file-backed
// (badger's mapped files, kept down by BadgerOptions.MappedBudget) parts.
func TestBadgerRSS1GiB(t *testing.T) {
	if os.Getenv(rssDirEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() || raceEnabled {
		t.Skip("writes 1 GiB; the race detector inflates memory")
	}
	out, err := childCommand("TestRSSChild", rssDirEnv, t.TempDir()).CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var line string
	for l := range strings.Lines(string(out)) {
		if strings.HasPrefix(l, "RSS-REPORT ") {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		t.Fatalf("no report from child:\n%s", out)
	}
	vals := make(map[string]float64)
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		vals[k], _ = strconv.ParseFloat(v, 64)
	}
	t.Logf("1 GiB written in %.1fs (%.0f MB/s), read back and verified in %.1fs: VmHWM %.0f MiB, peak RssAnon %.0f MiB, final RssAnon %.0f MiB, peak RssFile %.0f MiB, final RssFile %.0f MiB",
		vals["seconds"], 1024/vals["seconds"]*1.048576, vals["readseconds"], vals["VmHWM"]/1024, vals["RssAnonPeak"]/1024,
		vals["RssAnon"]/1024, vals["RssFilePeak"]/1024, vals["RssFile"]/1024)
	// Bounds with margin (measured: RssAnon 66-90 MiB, VmHWM 207-234 MiB);
	// without the value log trimming VmHWM would be over 1 GiB.
	if anon := vals["RssAnonPeak"] / 1024; anon > 256 {
		t.Errorf("peak RssAnon %.0f MiB over 256 MiB", anon)
	}
	if hwm := vals["VmHWM"] / 1024; hwm > 448 {
		t.Errorf("VmHWM %.0f MiB over 448 MiB", hwm)
	}
}
