package initiator_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
)

// TestGaveUp: Client.GaveUp stays open while the target is away (its
// connections refused: the client retries for as long as it takes) and
// comes back; it is closed, with Err saying why, once the target refuses
// the login for good (the volume is gone), and every request then fails
// with that error. With NoReconnect the first loss gives up.
func TestGaveUp(t *testing.T) {
	e := newEnv(t, envOpts{addr: "127.0.0.1:0"})
	addr := e.addr
	c := e.client("giveup", func(cfg *initiator.Config) {
		cfg.ReconnectMin, cfg.ReconnectMax, cfg.HeartbeatInterval = 10*time.Millisecond, 50*time.Millisecond, -1
	})
	ctx := tctx(t)
	if err := c.WriteAt(ctx, make([]byte, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	e.stop()
	select {
	case <-c.GaveUp():
		t.Fatalf("gave up while the target was only away: %v", c.Err())
	case <-time.After(500 * time.Millisecond): // some 10 refused connections
	}
	e.start(envOpts{addr: addr})
	if err := c.ReadAt(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatalf("read after the target came back: %v", err)
	}
	if c.Err() != nil {
		t.Fatalf("Err after a reconnect: %v", c.Err())
	}

	e.stop()
	if err := e.st.DeleteVolume(context.Background(), "vol0"); err != nil {
		t.Fatal(err)
	}
	e.start(envOpts{addr: addr})
	select {
	case <-c.GaveUp():
	case <-time.After(20 * time.Second):
		t.Fatal("not given up 20 s after the target lost the volume")
	}
	var le *initiator.LoginError
	if err := c.Err(); !errors.As(err, &le) || le.Status != blockproto.StatusNoVolume {
		t.Fatalf("Err = %v, want the refusal (no such volume)", err)
	}
	if err := c.ReadAt(ctx, make([]byte, 4096), 0); !errors.As(err, &le) || le.Status != blockproto.StatusNoVolume {
		t.Fatalf("read after giving up: %v, want the refusal", err)
	}

	t.Run("NoReconnect", func(t *testing.T) {
		e := newEnv(t, envOpts{addr: "127.0.0.1:0"})
		c := e.client("noreconnect", func(cfg *initiator.Config) { cfg.NoReconnect, cfg.HeartbeatInterval = true, -1 })
		e.stop()
		select {
		case <-c.GaveUp():
		case <-time.After(20 * time.Second):
			t.Fatal("not given up 20 s after losing the session with NoReconnect")
		}
		if err := c.Err(); err == nil {
			t.Fatal("gave up without an error")
		}
	})
}
