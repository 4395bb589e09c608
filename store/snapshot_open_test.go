package store

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
)

// TestDeleteSnapshotBesideItsOpen: an open of VOL@SNAP that starts while
// DeleteSnapshot of it runs (after it found no handle open) fails with
// ErrBusy; it never returns a handle on a snapshot the deletion goes on to
// take apart, which would read the volume's head in place of the
// snapshot's data (or clusters the deletion freed for other volumes).
func TestDeleteSnapshotBesideItsOpen(t *testing.T) {
	ctx := context.Background()
	be, err := openThinBackend(t.TempDir(), ThinOptions{ClusterSize: 16 << 10, CommitInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	s := newVolumeStore(be)
	defer s.Close()
	if _, err := s.CreateVolume(ctx, "a", 1<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	old, cur := bytes.Repeat([]byte{1}, BlockSize), bytes.Repeat([]byte{2}, BlockSize)
	if err := v.WriteBlocks(ctx, 0, old, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(ctx, "a", "s"); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteBlocks(ctx, 0, cur, true); err != nil {
		t.Fatal(err)
	}
	v.Close()

	// The deletion's first commit (before it marks the snapshot) opens
	// the snapshot beside it and goes on once the open has looked the
	// snapshot up (it then waits for the next commit) or has failed.
	var armed atomic.Bool
	armed.Store(true)
	opened := make(chan error, 1)
	var snap Volume
	hook := func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		done := make(chan struct{})
		go func() {
			var err error
			snap, err = s.OpenVolume(ctx, "a@s")
			opened <- err
			close(done)
		}()
		for {
			select {
			case <-done:
				return
			default:
			}
			be.committer.mu.Lock()
			waiting := be.committer.pending != nil
			be.committer.mu.Unlock()
			if waiting {
				return
			}
			runtime.Gosched()
		}
	}
	be.pool.syncHook.Store(&hook)
	errDelete := s.DeleteSnapshot(ctx, "a", "s")
	errOpen := <-opened
	be.pool.syncHook.Store(nil)
	if errOpen == nil {
		defer snap.Close()
	}
	switch {
	case errDelete == nil && errOpen == nil:
		got := make([]byte, BlockSize)
		if err := snap.ReadBlocks(ctx, 0, got); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("the snapshot was deleted while a handle on it opened (block 0 reads %d, the snapshot held %d)", got[0], old[0])
	case errDelete == nil && !errors.Is(errOpen, ErrBusy):
		t.Fatalf("open during the deletion: %v, want ErrBusy", errOpen)
	case errDelete != nil && !errors.Is(errDelete, ErrBusy):
		t.Fatalf("deletion: %v", errDelete)
	}
	if err := be.check(ctx); err != nil {
		t.Fatal(err)
	}
}
