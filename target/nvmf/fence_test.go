package nvmf

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
)

// takeOverStore is a store whose volume handles fail every operation with
// store.ErrFenced once taken is set: what a shared store (rbd) does when
// another target took the volume over.
type takeOverStore struct {
	store.Store
	taken *atomic.Bool
}

func (s takeOverStore) OpenVolume(ctx context.Context, name string) (store.Volume, error) {
	v, err := s.Store.OpenVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	return takeOverVolume{Volume: v, taken: s.taken}, nil
}

type takeOverVolume struct {
	store.Volume
	taken *atomic.Bool
}

func (v takeOverVolume) fenced() error {
	if v.taken.Load() {
		return fmt.Errorf("test store: %w", store.ErrFenced)
	}
	return nil
}

func (v takeOverVolume) ReadBlocks(ctx context.Context, lba uint64, dst []byte) error {
	if err := v.fenced(); err != nil {
		return err
	}
	return v.Volume.ReadBlocks(ctx, lba, dst)
}

func (v takeOverVolume) WriteBlocks(ctx context.Context, lba uint64, src []byte, fua bool) error {
	if err := v.fenced(); err != nil {
		return err
	}
	return v.Volume.WriteBlocks(ctx, lba, src, fua)
}

func (v takeOverVolume) Flush(ctx context.Context) error {
	if err := v.fenced(); err != nil {
		return err
	}
	return v.Volume.Flush(ctx)
}

// InMemory is false: a shared store's requests wait for the network.
func (v takeOverVolume) InMemory() bool { return false }

// TestFencedVolumeEndsController: when the store reports the volume taken
// over by another target (store.ErrFenced), the target ends every session
// of the volume, the NVMe controllers' included. The controllers end too,
// with their queues, as a native session's QPs go down: the host sees its
// connections end and recovers (reconnects, or fails over to another
// path), instead of staying attached to a controller whose hold on the
// volume is gone, its I/O failing forever.
func TestFencedVolumeEndsController(t *testing.T) {
	var taken atomic.Bool
	e := newTestEnv(t, envOpts{wrap: func(st store.Store) store.Store { return takeOverStore{Store: st, taken: &taken} }})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 2})
	if st, err := h.write(0, 0, make([]byte, store.BlockSize), true); err != nil || st != StatusSuccess {
		t.Fatalf("write before the take-over: %v %v", st, err)
	}
	taken.Store(true)
	// The write is not answered (the native sessions leave theirs so too):
	// the host replays it once its connection is gone.
	r, _, err := h.io[0].do(rw(IOWrite, 0, 1), cmdOpts{dir: dirFromHost, data: make([]byte, store.BlockSize), timeout: 2 * time.Second})
	if !errors.Is(err, errLost) {
		t.Errorf("write after the take-over: %v %v, want no completion and the queue lost", r.status(), err)
	}
	for _, q := range append([]*hostQueue{h.admin}, h.io...) {
		if err := q.waitLost(5 * time.Second); err != nil {
			t.Fatalf("the controller of a fenced volume: %v", err)
		}
	}
	waitFor(t, 5*time.Second, "the controller to go", func() bool { return e.srv.m.Controllers.Load() == 0 })
}
