package target

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
)

// fenceAtCloseStore is the memory store whose volume handles are
// store.Fencers that find the take-over only as they close: what an rbd
// head that another gateway took over does when its last session ended
// before its periodic look at the lock (store/rbd_device.go, close). The
// real case runs against a Ceph cluster in store/rbdtest
// (TestRBDFencedFoundAtClose) and cmd/e2e (TestRBDFailoverStop).
type fenceAtCloseStore struct{ store.Store }

func (s fenceAtCloseStore) OpenVolume(ctx context.Context, name string) (store.Volume, error) {
	v, err := s.Store.OpenVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	return &fenceAtCloseVolume{Volume: v, fenced: make(chan struct{})}, nil
}

type fenceAtCloseVolume struct {
	store.Volume
	fenced chan struct{}
	once   sync.Once
}

func (v *fenceAtCloseVolume) FencingEpoch() uint64    { return 1 }
func (v *fenceAtCloseVolume) DurableID() uint64       { return 0x5eed }
func (v *fenceAtCloseVolume) Fenced() <-chan struct{} { return v.fenced }

// Close finds the take-over as an rbd head does, after a round trip to
// the cluster (the delay only gives a target that stopped watching too
// early the time to do so; a correct one waits for Close whatever it takes).
func (v *fenceAtCloseVolume) Close() error {
	v.once.Do(func() {
		time.Sleep(20 * time.Millisecond)
		close(v.fenced)
	})
	return v.Volume.Close()
}

// TestFencingFoundAtCloseReported: a volume whose store finds the fencing
// only while the target lets the volume go (its last session ended) is
// still reported fenced: the target's watch of the handle lasts until the
// handle is closed, not only until the last session released it.
func TestFencingFoundAtCloseReported(t *testing.T) {
	r := newRigOn(t, fenceAtCloseStore{store.NewMemory()}, nil)
	p := r.dial(4, 0)
	r.session()
	p.ep.Close(nil)
	r.waitFor("the session's end", r.noSession)
	r.waitFor("the fencing found at close reported (rtarget_volumes_fenced_total)", func() bool {
		return r.tgt.m.Fenced.Load() == 1
	})
}
