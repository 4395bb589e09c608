package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSyncGroupCoalesces holds the first sync running while 100 callers
// arrive: they all share the one sync queued behind it, so the total is 2.
func TestSyncGroupCoalesces(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	g := newSyncGroup(func() error {
		if calls.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
		return nil
	})
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); g.Sync(ctx) }()
	<-started

	const n = 100
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Sync(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	// Wait until all n wait on the queued sync: one leads it, n-1 joined.
	for {
		g.mu.Lock()
		joined := g.joined
		g.mu.Unlock()
		if joined == n-1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if got := calls.Load(); got != 2 {
		t.Fatalf("%d syncs for %d concurrent callers, want 2", got, n+1)
	}
	// Idle again: a lone caller runs its own sync.
	if err := g.Sync(ctx); err != nil || calls.Load() != 3 {
		t.Fatalf("lone Sync: %v, %d calls", err, calls.Load())
	}
}

// TestSyncGroupStartsAfterCall checks that no caller is served by a sync
// that began before it called.
func TestSyncGroupStartsAfterCall(t *testing.T) {
	var gen atomic.Int64 // incremented when a sync starts
	g := newSyncGroup(func() error {
		gen.Add(1)
		time.Sleep(100 * time.Microsecond)
		return nil
	})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				before := gen.Load()
				g.Sync(context.Background())
				if gen.Load() <= before {
					t.Error("Sync returned without a sync starting after the call")
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestSyncGroupErrorAndCancel(t *testing.T) {
	boom := errors.New("boom")
	release := make(chan struct{})
	var calls atomic.Int32
	g := newSyncGroup(func() error {
		if calls.Add(1) == 1 {
			<-release
		}
		return boom
	})
	done := make(chan error)
	go func() { done <- g.Sync(context.Background()) }()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { done <- g.Sync(context.Background()) }() // leads the queued round
	for {
		g.mu.Lock()
		queued := g.pending != nil
		g.mu.Unlock()
		if queued {
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Sync(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("joiner with cancelled ctx: %v", err)
	}
	close(release)
	for range 2 {
		if err := <-done; !errors.Is(err, boom) {
			t.Fatalf("Sync error %v, want boom", err)
		}
	}
}
