//go:build ceph

package rbdtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

var secret = []byte("a pre-shared secret for the rbd tests")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// gateway is a target serving an rbd store of its own (its own librados
// clients): one gateway of several in front of the cluster.
type gateway struct {
	addr string
	tg   *target.Target
}

func startGateway(t *testing.T, spec string) *gateway {
	t.Helper()
	st := openStore(t, spec)
	dev, err := rnic.Open(rnic.Config{Name: "gateway", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Store: st, Device: dev, Secret: target.StaticSecret(secret), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(context.Background(), l)
	t.Cleanup(func() {
		tg.Close()
		l.Close()
		dev.Close()
	})
	return &gateway{addr: l.Addr().String(), tg: tg}
}

// TestRBDFailoverLocks: locks follow no image across gateways; they are
// dropped, and the initiator sees it. A numbered lock taken through the
// first gateway is lost when the initiator moves to the second (Unlock:
// ErrLockLost), a write carrying its token is refused as stale there
// (the second gateway's tokens start above the epoch it raised), nothing
// of that write lands, and a lock taken anew works.
func TestRBDFailoverLocks(t *testing.T) {
	s, spec := freshStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := s.CreateVolume(ctx, "vol", 16<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := startGateway(t, spec), startGateway(t, spec)
	c, err := initiator.Connect(ctx, initiator.Config{Addr: a.addr + "," + b.addr, Volume: "vol", Initiator: "locker",
		Secret: secret, Logger: quiet(), HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := bytes.Repeat([]byte{0x11}, 4096)
	if err := c.WriteAtToken(ctx, old, 0, true, l.Token()); err != nil {
		t.Fatal(err)
	}
	// The first gateway goes away; the client moves to the second, which
	// takes the image over.
	a.tg.Close()
	if err := c.WriteAt(ctx, old, 4096, true); err != nil {
		t.Fatalf("write after the move: %v", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, initiator.ErrLockLost) {
		t.Fatalf("Unlock of a lock taken at the old gateway: %v, want ErrLockLost", err)
	}
	stale := bytes.Repeat([]byte{0x22}, 4096)
	err = c.WriteAtToken(ctx, stale, 0, true, l.Token())
	if !errors.Is(err, initiator.ErrStaleToken) {
		t.Fatalf("write with a token of the old gateway: %v, want ErrStaleToken", err)
	}
	t.Logf("token %#x drawn at the old gateway: %v", l.Token(), err)
	got := make([]byte, 4096)
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the stale write changed the block (err %v)", err)
	}
	l2, err := c.TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("new token %#x not above the old %#x", l2.Token(), l.Token())
	}
	if err := c.WriteAtToken(ctx, stale, 0, true, l2.Token()); err != nil {
		t.Fatalf("write with a fresh token: %v", err)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
