package endpoint

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPoolClasses(t *testing.T) {
	p := NewPool(4096, 1<<20, 4<<20)
	for _, tc := range []struct{ n, size int }{{1, 4096}, {4096, 4096}, {4097, 8192}, {300 << 10, 512 << 10}, {1 << 20, 1 << 20}} {
		b := p.TryGet(tc.n)
		if len(b) != tc.size {
			t.Fatalf("TryGet(%d): %d bytes, want %d", tc.n, len(b), tc.size)
		}
		p.Put(b)
	}
	if b := p.TryGet(1<<20 + 1); b != nil {
		t.Fatal("TryGet beyond the largest class returned a buffer")
	}
	if _, err := p.Get(context.Background(), 2<<20); err == nil {
		t.Fatal("Get beyond the largest class succeeded")
	}
	// A freed buffer is reused, not allocated again.
	a := p.TryGet(8192)
	p.Put(a)
	if b := p.TryGet(8192); &b[0] != &a[0] {
		t.Fatal("a cached buffer was not reused")
	}
}

// TestPoolBudget: the budget counts buffers in use and cached; a request
// that does not fit drops cached buffers of other classes, then waits for
// a Put (or its context).
func TestPoolBudget(t *testing.T) {
	p := NewPool(4096, 1<<20, 1<<20)
	small := make([][]byte, 0, 256)
	for i := 0; i < 256; i++ {
		b := p.TryGet(4096)
		if b == nil {
			t.Fatalf("TryGet %d of 256 small buffers failed within the budget", i)
		}
		small = append(small, b)
	}
	if p.TryGet(4096) != nil || p.InUse() != 1<<20 {
		t.Fatalf("past the budget: in use %d", p.InUse())
	}
	for _, b := range small[:128] {
		p.Put(b)
	}
	// Half is cached: a 512 KiB buffer fits once those are dropped.
	big := p.TryGet(512 << 10)
	if big == nil || p.InUse() != 1<<20 {
		t.Fatalf("512 KiB after freeing half: %v, in use %d", big != nil, p.InUse())
	}
	// Nothing fits now: Get waits for a Put.
	got := make(chan []byte)
	go func() {
		b, err := p.Get(context.Background(), 256<<10)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	p.Put(big)
	if b := <-got; len(b) != 256<<10 {
		t.Fatalf("Get after a Put: %d bytes", len(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Get(ctx, 1<<20); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with the budget in use: %v, want the context's error", err)
	}
}
