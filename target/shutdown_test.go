package target

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
)

// gatedStore is the memory store whose volume handles hold their first
// Flush until the test opens the gate, and count their Close calls.
type gatedStore struct {
	store.Store
	flushing chan struct{} // closed when the first Flush began
	gate     chan struct{} // the first Flush returns once this is closed
	first    atomic.Bool
	closes   atomic.Int32
}

func (g *gatedStore) OpenVolume(ctx context.Context, name string) (store.Volume, error) {
	v, err := g.Store.OpenVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	return &gatedVolume{Volume: v, g: g}, nil
}

type gatedVolume struct {
	store.Volume
	g *gatedStore
}

func (v *gatedVolume) Flush(ctx context.Context) error {
	if v.g.first.CompareAndSwap(false, true) {
		close(v.g.flushing)
		<-v.g.gate
	}
	return v.Volume.Flush(ctx)
}

func (v *gatedVolume) Close() error {
	v.g.closes.Add(1)
	return v.Volume.Close()
}

// TestShutdownFlushWhileLastSessionEnds: Shutdown flushes every open
// volume; the last session of a volume ending during that flush (its
// initiator went away) must not close the handle under it. Shutdown holds
// a reference of its own while it flushes, and the handle is closed
// exactly once, after the flush. The race was seen as "target shutdown:
// flushing vol0 ... closed" in the initiator's tests.
func TestShutdownFlushWhileLastSessionEnds(t *testing.T) {
	var g *gatedStore
	r := newRig(t, func(c *Config) {
		g = &gatedStore{Store: c.Store, flushing: make(chan struct{}), gate: make(chan struct{})}
		c.Store = g
	})
	p := r.dial(4, 0)
	r.session()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- r.tgt.Shutdown(ctx) }()
	select {
	case <-g.flushing:
	case <-ctx.Done():
		t.Fatal("Shutdown never flushed the volume")
	}

	// The initiator goes away while Shutdown's flush is under way: the
	// target ends its session, which drops the session's reference.
	p.ep.Close(nil)
	r.waitFor("the session to end", r.noSession)
	if n := g.closes.Load(); n != 0 {
		t.Errorf("the volume was closed %d times while Shutdown flushed it", n)
	}

	close(g.gate)
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := g.closes.Load(); n != 1 {
		t.Errorf("the volume was closed %d times after Shutdown, want 1", n)
	}
	r.tgt.mu.Lock()
	left := len(r.tgt.vols)
	r.tgt.mu.Unlock()
	if left != 0 {
		t.Errorf("%d volumes still open after Shutdown", left)
	}
}
