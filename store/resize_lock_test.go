package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestResizeWaitEndsWithCtx: a resize or rollback waiting behind another
// gives up when its ctx ends, and says why; the holder's unlock lets the
// next one in.
func TestResizeWaitEndsWithCtx(t *testing.T) {
	s := newVolumeStore(nil)
	if err := s.lockResize(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.lockResize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want the deadline", err)
	}
	// Through the API: the wait fails before anything is looked up (the
	// backend is nil here), with the operation named.
	if err := s.ResizeVolume(ctx, "v", 1<<20); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ResizeVolume while held: %v", err)
	}
	if err := s.Rollback(ctx, "v", "s"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Rollback while held: %v", err)
	}
	s.unlockResize()
	if err := s.lockResize(context.Background()); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	s.unlockResize()
}
