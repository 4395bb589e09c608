package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
)

// defaultMemoryLimit is --memory-limit's default: room for a handful of
// sessions and the thin store's metadata before the limit has to follow
// the live heap.
const defaultMemoryLimit = 64 << 20

// memoryLimitFlag is serve's --memory-limit.
func memoryLimitFlag() cli.Flag {
	return &cli.StringFlag{Name: "memory-limit", Value: clix.FormatSize(defaultMemoryLimit), EnvVars: []string{"RTARGET_MEMORY_LIMIT"},
		Usage: "soft limit on the Go runtime's memory (`SIZE` like 64M; 0: none, the collector lets the heap grow to twice " +
			"what is live). The collector runs more often to stay under it; when what is live grows near it (many sessions, " +
			"large volume maps), the limit follows: it stays 1/16 above the live heap, so the collector never runs flat out " +
			"(a fixed limit below the live heap would cost up to half the CPU) and the heap stays well under twice the live " +
			"size. A GOMEMLIMIT environment variable, if set, wins and this flag is ignored"}
}

// memoryGovernor keeps the runtime's soft memory limit at
// max(base, live heap + live/16 + the runtime's memory outside the heap),
// updated after every collection. The collector's default pacing
// (GOGC=100) lets the heap reach twice its live size before a cycle;
// rtarget's live heap is mostly long-lived and pointer-free (write grants
// and other QP buffers, the volume maps, badger's memtables), so a cycle
// is cheap and a limit near the live size lowers the peak resident memory
// for little CPU (8 sessions over 3 volumes writing 4 GiB in 4 KiB blocks
// at random: 190 cycles instead of 11 in 45 s, about 1% of the CPU; peak
// RSS 250-280 -> 120-128 MiB). A fixed limit fails badly when the live
// heap outgrows it (more sessions, larger maps): the collector then runs
// back to back, capped at half the CPU. Following the live heap keeps
// 1/16 of it as room to allocate in: the collector runs every live/16
// bytes allocated, 16 times as often as GOGC=100 would, and as a cycle's
// work grows with the live heap, the collector's share of the CPU does not
// depend on the live size.
type memoryGovernor struct {
	base    int64
	log     *slog.Logger
	samples []metrics.Sample
	limit   int64 // as last set
}

// followShift: the limit stays live>>followShift above the live heap.
const followShift = 4

// Sample indexes of memoryGovernor.samples.
const (
	mgLive = iota
	mgTotal
	mgObjects
	mgFree
	mgReleased
)

// startMemoryGovernor applies --memory-limit (flag) and keeps the limit up
// to date until ctx ends; it returns nil (nothing to do) if GOMEMLIMIT is
// set or the limit is 0.
func startMemoryGovernor(ctx context.Context, flag string, log *slog.Logger) (*memoryGovernor, error) {
	var base int64
	var err error
	if strings.TrimSpace(flag) != "0" {
		base, err = clix.ParseSize(flag)
	}
	if err != nil {
		return nil, fmt.Errorf("--memory-limit %q: want a size like 64M, or 0: %w", flag, err)
	}
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		log.Info("memory limit from GOMEMLIMIT: --memory-limit ignored", "GOMEMLIMIT", env)
		return nil, nil
	}
	if base == 0 {
		return nil, nil
	}
	g := newMemoryGovernor(base, log)
	g.update()
	go g.run(ctx)
	return g, nil
}

func newMemoryGovernor(base int64, log *slog.Logger) *memoryGovernor {
	return &memoryGovernor{base: base, log: log, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}}
}

// run updates the limit after every collection (the live heap is known
// only then), until ctx ends. Reacting to each cycle, not polling, matters
// when the live heap jumps past the limit (sessions logging in): every
// cycle the stale limit forces raises it.
func (g *memoryGovernor) run(ctx context.Context) {
	cycle := make(chan struct{}, 1)
	afterEachGC(ctx, cycle)
	for {
		select {
		case <-ctx.Done():
			return
		case <-cycle:
			g.update()
		}
	}
}

// gcSentinel is an object nothing references: its cleanup runs once a
// collection has found it unreachable. 64 bytes, so it is not packed with
// other small objects (whose cleanups may run late).
type gcSentinel [64]byte

// afterEachGC sends to cycle (without blocking) after each collection
// until ctx ends.
func afterEachGC(ctx context.Context, cycle chan<- struct{}) {
	runtime.AddCleanup(new(gcSentinel), func(struct{}) {
		select {
		case cycle <- struct{}{}:
		default:
		}
		if ctx.Err() == nil {
			afterEachGC(ctx, cycle)
		}
	}, struct{}{})
}

// update sets the limit from the live heap of the last completed cycle.
// It raises the limit whenever the live heap asks for more, and lowers it
// only by 1/16 or more (each change is a call into the runtime and maybe
// a log line).
func (g *memoryGovernor) update() {
	metrics.Read(g.samples)
	v := func(i int) int64 { return int64(g.samples[i].Value.Uint64()) }
	live := v(mgLive)
	// Stacks, the runtime's metadata, other memory outside the heap and
	// the unused parts of the heap's spans count against the limit too;
	// free pages do not (the runtime returns them to the system to stay
	// under the limit).
	other := v(mgTotal) - v(mgObjects) - v(mgFree) - v(mgReleased)
	limit := max(g.base, live+live>>followShift+other)
	if limit == g.limit || limit < g.limit && g.limit-limit < g.limit/16 {
		return
	}
	following, wasFollowing := limit > g.base, g.limit > g.base
	g.limit = limit
	debug.SetMemoryLimit(limit)
	switch {
	case following && !wasFollowing:
		g.log.Info("the live heap is near --memory-limit: the limit follows it", "live", clix.FormatSize(live),
			"limit", clix.FormatSize(limit), "memory_limit", clix.FormatSize(g.base))
	case !following && wasFollowing:
		g.log.Info("the live heap is back under --memory-limit", "live", clix.FormatSize(live), "limit", clix.FormatSize(limit))
	}
}
