package initiator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
)

// TestTryLockWithoutSlot: a numbered lock's word names its holder by
// reservation slot (blockproto.LockValue), which is how other sessions
// learn who holds it and how the target clears the locks of a session
// that ended. A session whose WELCOME gave it no slot (blockproto.NoSlot)
// has nothing to put there: LockValue's slot+1 wraps to 0, a word that
// names no holder, which LockHolder reads as a free lock and the target
// can never clear. TryLock must refuse it with ErrNoSlot, as Reserve
// does, and leave the lock word alone. The target is a fake one that
// logs the session in without a slot and serves a lock table.
func TestTryLockWithoutSlot(t *testing.T) {
	addr := fakeTarget(t, func(ep *endpoint.Endpoint, recv func() []byte, send func([]byte)) {
		table := make([]byte, blockproto.LockTableLen(4))
		mr, err := ep.RegisterMR(rnic.Bytes(table), rnic.MROptions{
			Access: rnic.LocalRead | rnic.LocalWrite | rnic.RemoteAtomic, ZeroBased: true})
		if err != nil {
			t.Error(err)
			return
		}
		if !fakeLogin(t, recv, send, blockproto.WelcomeFields{Slot: blockproto.NoSlot, LockSTag: uint32(mr.STag()), LockCount: 4}) {
			return
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "v", Initiator: "i", Secret: testSecret,
		Logger: logger(), QPs: 1, NoReconnect: true, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, 1)
	if err == nil {
		holder, held, herr := c.LockHolder(ctx, 1)
		t.Fatalf("TryLock without a reservation slot took lock %d (token %d); the lock then reads as held %v by %q (%v)",
			l.Number(), l.Token(), held, holder, herr)
	}
	if !errors.Is(err, initiator.ErrNoSlot) {
		t.Fatalf("TryLock without a reservation slot: %v, want ErrNoSlot", err)
	}
	if _, held, err := c.LockHolder(ctx, 1); err != nil || held {
		t.Fatalf("after the refused TryLock: held %v, %v; want a free lock", held, err)
	}
}
