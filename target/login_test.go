package target

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// openGateStore is a store whose OpenVolume, once armed, holds its first
// call until the test opens the gate.
type openGateStore struct {
	store.Store
	armed   atomic.Bool
	opening chan struct{} // closed when the held OpenVolume began
	gate    chan struct{}
}

func (g *openGateStore) OpenVolume(ctx context.Context, name string) (store.Volume, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.opening)
		<-g.gate
	}
	return g.Store.OpenVolume(ctx, name)
}

// TestLoginFailsAfterAttach: a QP whose connection is lost after its
// PROOF, while the target opens the volume, fails its login in welcome,
// after the session took it. Ending that session must leave the
// QPsActive gauge as it was: the QP was never counted, and ending the
// session subtracted it anyway (the gauge went to -1 and stayed there).
func TestLoginFailsAfterAttach(t *testing.T) {
	var g *openGateStore
	r := newRig(t, func(c *Config) {
		g = &openGateStore{Store: c.Store, opening: make(chan struct{}), gate: make(chan struct{})}
		c.Store = g
	})
	g.armed.Store(true)
	p, _, _, _ := r.dialProof(4, 0, "vol0")
	<-g.opening
	var c *conn
	r.waitFor("the login in progress", func() bool {
		r.tgt.mu.Lock()
		defer r.tgt.mu.Unlock()
		for x := range r.tgt.pending {
			c = x
		}
		return c != nil
	})
	p.ep.QP.Modify(rnic.StateError, rnic.ModifyAttrs{}) // the initiator's connection is reset
	r.waitFor("the target's QP to see the reset", func() bool {
		st := c.QP.State()
		return st != rnic.StateRTS && st != rnic.StateClosing
	})
	close(g.gate)
	r.waitFor("the login to fail", func() bool { return r.tgt.m.LoginFailures.Load() == 1 })
	r.waitFor("the session to end", r.noSession)
	if n := r.tgt.m.QPsActive.Load(); n != 0 {
		t.Fatalf("QPsActive %d after a login that failed, want 0", n)
	}
}

// TestLoginErrorUnwrap: a refused login keeps its cause for errors.Is and
// errors.As (the log's err names it; callers can tell a store's error
// from a canceled context).
func TestLoginErrorUnwrap(t *testing.T) {
	err := refuse(blockproto.StatusNoVolume, "volume vol0", fmt.Errorf("open: %w", store.ErrNotFound))
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("errors.Is(%v, ErrNotFound) = false", err)
	}
	var le *loginError
	if !errors.As(err, &le) || le.status != blockproto.StatusNoVolume {
		t.Errorf("errors.As(%v, *loginError): %+v", err, le)
	}
	if errors.Is(refuse(blockproto.StatusInvalid, "bad", nil), store.ErrNotFound) {
		t.Error("a refusal without a cause matches ErrNotFound")
	}
}
