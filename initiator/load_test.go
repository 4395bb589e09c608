package initiator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
)

// loadBlock is the I/O size of TestLoad.
const loadBlock = 4096

// loadContent fills b with the content of version v of block blk of
// session s: distinct for every (s, blk, v), cheap to make.
func loadContent(b []byte, s, blk int, v uint32) {
	x := uint64(s)<<48 ^ uint64(blk)<<24 ^ uint64(v) ^ 0x9e3779b97f4a7c15
	for i := 0; i+8 <= len(b); i += 8 {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
}

// rssMiB is the process's resident set (VmRSS) in MiB, or -1.
func rssMiB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return -1
			}
			return kb / 1024
		}
	}
	return -1
}

type loadSample struct {
	t          time.Duration
	goroutines int
	rss        float64
	ops        int64
}

// loadSession is one initiator session's region and what it expects there.
type loadSession struct {
	id   int
	c    *initiator.Client
	base int64    // first byte of the region
	ver  []uint32 // per block: the last version written (0: never, reads zeros)
}

// TestLoad: 16 sessions (separate clients) against one thin-store-backed
// target, each with 32 goroutines doing verified random 4 KiB I/O on its
// own region for a bounded time (RNIC_LOAD_DURATION, default 4 s). Every
// write is read back and compared, every read is checked against the
// expected version, and at the end every block of the volume is read back.
// Goroutines and RSS are sampled every second and the curve is printed.
// During the run the goroutine count stays flat: no sample after the first
// (taken after a second of load) exceeds it by more than 10% or 50,
// whichever is more. RSS does not run away (see below). After the clients
// close and the target stops, the goroutine count returns to its baseline.
func TestLoad(t *testing.T) {
	const (
		sessions = 16
		qd       = 32
		size     = 256 << 20
		region   = size / sessions
		blocks   = region / loadBlock
	)
	dur := 4 * time.Second
	if s := os.Getenv("RNIC_LOAD_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("RNIC_LOAD_DURATION: %v", err)
		}
		dur = d
	}
	if testing.Short() {
		dur = min(dur, time.Second)
	}
	baseline := runtime.NumGoroutine()
	e := newEnv(t, envOpts{thin: true, size: size})
	// tctx's 60 s would end a long run: allow the run plus the read-back.
	ctx, cancel := context.WithTimeout(context.Background(), dur+2*time.Minute)
	defer cancel()

	ss := make([]*loadSession, sessions)
	for i := range ss {
		c, err := e.dial(fmt.Sprintf("load-%02d", i), nil)
		if err != nil {
			t.Fatalf("connect session %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		ss[i] = &loadSession{id: i, c: c, base: int64(i) * region, ver: make([]uint32, blocks)}
	}

	var (
		ops, writes, reads, ioErrs, mismatches atomic.Int64
		firstErr                               sync.Once
	)
	report := func(format string, args ...any) {
		firstErr.Do(func() { t.Errorf(format, args...) })
	}

	// Sampler: once a second, until the load ends.
	start := time.Now()
	var samples []loadSample
	sample := func() {
		s := loadSample{time.Since(start), runtime.NumGoroutine(), rssMiB(), ops.Load()}
		samples = append(samples, s)
		t.Logf("load t=%5.1fs goroutines=%5d rss=%7.1f MiB ops=%9d iops=%8.0f",
			s.t.Seconds(), s.goroutines, s.rss, s.ops, float64(s.ops)/s.t.Seconds())
	}
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				sample()
			case <-stopSampler:
				return
			}
		}
	}()

	// Load: worker g of a session owns the session's blocks b with
	// b%qd == g, so the expected version of every block is exact.
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for _, s := range ss {
		for g := 0; g < qd; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(s.id), uint64(g)))
				wbuf := make([]byte, loadBlock)
				rbuf := make([]byte, loadBlock)
				want := make([]byte, loadBlock)
				for time.Now().Before(deadline) {
					blk := g + qd*r.IntN(blocks/qd)
					off := s.base + int64(blk)*loadBlock
					if r.IntN(2) == 0 {
						v := s.ver[blk] + 1
						loadContent(wbuf, s.id, blk, v)
						if err := s.c.WriteAt(ctx, wbuf, off, false); err != nil {
							ioErrs.Add(1)
							report("session %d: write block %d: %v", s.id, blk, err)
							return
						}
						s.ver[blk] = v
						writes.Add(1)
						ops.Add(1)
					}
					if err := s.c.ReadAt(ctx, rbuf, off); err != nil {
						ioErrs.Add(1)
						report("session %d: read block %d: %v", s.id, blk, err)
						return
					}
					reads.Add(1)
					ops.Add(1)
					if v := s.ver[blk]; v == 0 {
						clear(want)
					} else {
						loadContent(want, s.id, blk, v)
					}
					if !bytes.Equal(rbuf, want) {
						mismatches.Add(1)
						report("session %d: block %d differs from version %d", s.id, blk, s.ver[blk])
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopSampler)
	<-samplerDone
	total := ops.Load()
	t.Logf("load: %d sessions x QD%d for %v: %d ops (%d writes, %d reads), %.0f IOPS, %d I/O errors, %d mismatches",
		sessions, qd, elapsed.Round(time.Millisecond), total, writes.Load(), reads.Load(),
		float64(total)/elapsed.Seconds(), ioErrs.Load(), mismatches.Load())

	// Every block read back, by each session over its own region.
	if !t.Failed() {
		var verified, written atomic.Int64
		var vwg sync.WaitGroup
		for _, s := range ss {
			vwg.Add(1)
			go func() {
				defer vwg.Done()
				const chunk = 64 // blocks per read
				buf := make([]byte, chunk*loadBlock)
				want := make([]byte, loadBlock)
				for b0 := 0; b0 < blocks; b0 += chunk {
					if err := s.c.ReadAt(ctx, buf, s.base+int64(b0)*loadBlock); err != nil {
						ioErrs.Add(1)
						report("session %d: final read at block %d: %v", s.id, b0, err)
						return
					}
					for i := 0; i < chunk; i++ {
						blk := b0 + i
						if v := s.ver[blk]; v == 0 {
							clear(want)
						} else {
							loadContent(want, s.id, blk, v)
							written.Add(1)
						}
						if !bytes.Equal(buf[i*loadBlock:(i+1)*loadBlock], want) {
							mismatches.Add(1)
							report("session %d: final read: block %d differs from version %d", s.id, blk, s.ver[blk])
						}
						verified.Add(1)
					}
				}
			}()
		}
		vwg.Wait()
		t.Logf("final read-back: %d blocks verified (%d written at least once), %d mismatches",
			verified.Load(), written.Load(), mismatches.Load())
		if verified.Load() != sessions*blocks {
			t.Errorf("verified %d blocks, want %d", verified.Load(), sessions*blocks)
		}
	}
	if n := ioErrs.Load(); n != 0 {
		t.Errorf("%d I/O errors", n)
	}
	if n := mismatches.Load(); n != 0 {
		t.Errorf("%d mismatches", n)
	}

	// The curve, and the goroutine count flat during the run.
	var curve strings.Builder
	for _, s := range samples {
		fmt.Fprintf(&curve, " %.0fs:%d/%.0fMiB", s.t.Seconds(), s.goroutines, s.rss)
	}
	t.Logf("curve (t:goroutines/rss):%s", curve.String())
	if len(samples) >= 2 {
		first := samples[0].goroutines
		peak, at := -1, time.Duration(0)
		for _, s := range samples[1:] {
			if s.goroutines > peak {
				peak, at = s.goroutines, s.t
			}
		}
		limit := first + max(first/10, 50)
		t.Logf("goroutines during the run: %d at %.0fs, max %d after it (at %.0fs), limit %d",
			first, samples[0].t.Seconds(), peak, at.Seconds(), limit)
		if peak > limit {
			t.Errorf("goroutines grew during the run from %d to %d (limit %d)", first, peak, limit)
		}
	} else {
		t.Logf("goroutines during the run: %d samples, too few to compare (run longer)", len(samples))
	}

	// Loose RSS check: no runaway growth over the run. The first seconds
	// are warm-up (the store's first allocations, the race detector's shadow
	// memory), so growth up to 2x, or 256 MiB, is allowed.
	if n := len(samples); n >= 3 {
		third := (n + 2) / 3
		var early, late float64
		for _, s := range samples[:third] {
			early = max(early, s.rss)
		}
		for _, s := range samples[n-third:] {
			late = max(late, s.rss)
		}
		t.Logf("rss: first third max %.1f MiB, last third max %.1f MiB", early, late)
		if early > 0 && late > max(2*early, early+256) {
			t.Errorf("RSS grew from %.1f MiB to %.1f MiB over the run", early, late)
		}
	}

	// Everything down: the goroutines go back to the baseline.
	for _, s := range ss {
		if err := s.c.Close(); err != nil {
			t.Errorf("close session %d: %v", s.id, err)
		}
	}
	e.stop()
	if err := e.st.Close(); err != nil {
		t.Errorf("store close: %v", err)
	}
	const slack = 3
	var n int
	for wait := time.Now().Add(5 * time.Second); ; {
		if n = runtime.NumGoroutine(); n <= baseline+slack || time.Now().After(wait) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("goroutines: baseline %d, after shutdown %d", baseline, n)
	if n > baseline+slack {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines did not return to the baseline %d (+%d): %d left\n%s",
			baseline, slack, n, buf[:runtime.Stack(buf, true)])
	}
}
