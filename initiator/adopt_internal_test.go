package initiator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestSessionDiesBeforeAdopted: a session that dies after its login but
// before the client adopts it (its QPs already run, so a connection reset
// can fail it in that window) is lost like any other: the client logs in
// again and serves I/O. Before adopt, the client kept such a session as
// its own with no reconnect running, and every request then waited for a
// session that never came; CI's race detector caught the unlocked write
// of the session in Connect racing with lost.
func TestSessionDiesBeforeAdopted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, secret := startTarget(t, ctx, quiet)
	c, err := Connect(ctx, Config{Addr: addr, Volume: "v", Initiator: "adopt", Secret: secret, Logger: quiet, QPs: 1,
		ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	if err := c.WriteAt(ctx, buf, 0, false); err != nil {
		t.Fatal(err)
	}

	// The first session dialed after the loss below dies at once, before
	// the reconnect loop adopts it.
	var dials atomic.Int32
	c.dialed = func(s *session) {
		if dials.Add(1) == 1 {
			s.fail(errors.New("test: died before it was adopted"))
		}
	}
	first, err := c.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first.fail(errors.New("test: session lost"))

	if err := c.WriteAt(ctx, buf, 4096, false); err != nil {
		t.Fatalf("write after a session died before it was adopted: %v (sessions dialed since the loss: %d)",
			err, dials.Load())
	}
	if n := dials.Load(); n < 2 {
		t.Fatalf("%d sessions dialed since the loss, want the one that died and another", n)
	}
	s, err := c.current(ctx)
	if err != nil || s == first || s.isDead() {
		t.Fatalf("current session %p (dead %v), first %p, err %v", s, s != nil && s.isDead(), first, err)
	}
}
