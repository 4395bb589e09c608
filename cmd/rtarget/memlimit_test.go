package main

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestMemoryGovernor: the limit is --memory-limit while the live heap is
// small, follows the live heap (1/16 above it) when it grows past, and
// comes back when it shrinks; GOMEMLIMIT wins over the flag.
func TestMemoryGovernor(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	const base = 64 << 20
	runtime.GC()
	g := newMemoryGovernor(base, log)
	g.update()
	if got := debug.SetMemoryLimit(-1); got != base {
		t.Fatalf("live heap small: limit %d, want --memory-limit %d", got, base)
	}

	// 4x the base, live and pointer-free (the shape of rtarget's buffers).
	live := make([][]byte, 256)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	g.update()
	got := debug.SetMemoryLimit(-1)
	if got < 256<<20+256<<20/16 || got > 2*256<<20 {
		t.Fatalf("live heap 256 MiB: limit %d MiB, want 1/16 above it (272 MiB and a little)", got>>20)
	}
	if !strings.Contains(logs.String(), "the limit follows it") {
		t.Fatalf("no log line when the limit starts to follow the live heap:\n%s", logs.String())
	}
	runtime.KeepAlive(live)

	live = nil
	runtime.GC()
	g.update()
	if got := debug.SetMemoryLimit(-1); got != base {
		t.Fatalf("live heap back under the base: limit %d, want %d", got, base)
	}
	if !strings.Contains(logs.String(), "back under --memory-limit") {
		t.Fatalf("no log line when the limit is back to --memory-limit:\n%s", logs.String())
	}

	// Started: the limit follows the live heap after the next cycle.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Setenv("GOMEMLIMIT", "")
	if g, err := startMemoryGovernor(ctx, "64M", log); err != nil || g == nil {
		t.Fatalf("startMemoryGovernor: %v, %v", g, err)
	}
	live = make([][]byte, 256)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	deadline := time.Now().Add(10 * time.Second)
	for debug.SetMemoryLimit(-1) < 256<<20+256<<20/16 {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d MiB 10 s after the live heap grew to 256 MiB", debug.SetMemoryLimit(-1)>>20)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(live)
	cancel()

	// 0: no limit, no governor.
	debug.SetMemoryLimit(math.MaxInt64)
	if g, err := startMemoryGovernor(context.Background(), "0", log); err != nil || g != nil {
		t.Fatalf("--memory-limit 0: governor %v, err %v; want none", g, err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("--memory-limit 0: limit set to %d", got)
	}

	// GOMEMLIMIT set: the flag changes nothing; a bad flag is an error.
	debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "1GiB")
	if g, err := startMemoryGovernor(context.Background(), "64M", log); err != nil || g != nil {
		t.Fatalf("GOMEMLIMIT set: governor %v, err %v; want none", g, err)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("GOMEMLIMIT set: limit changed to %d", got)
	}
	for _, bad := range []string{"lots", "-5M"} {
		if _, err := startMemoryGovernor(context.Background(), bad, log); err == nil {
			t.Fatalf("--memory-limit %q accepted", bad)
		}
	}
}
