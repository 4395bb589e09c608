package initiator_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
)

// TestGrownVolumeShowsAfterRelogin: a volume grown while the client's
// session is down shows its new size once the client has logged in again
// by itself (an NBD export reads Size for each new connection), and the
// blocks past the old end are then reachable.
func TestGrownVolumeShowsAfterRelogin(t *testing.T) {
	const oldSize, newSize = 8 << 20, 16 << 20
	e := newEnv(t, envOpts{size: oldSize})
	addr := e.addr
	c := e.client("grow", nil)
	ctx := tctx(t)
	buf := bytes.Repeat([]byte{0x5a}, 4096)
	if got := c.Size(); got != oldSize {
		t.Fatalf("size %d, want %d", got, oldSize)
	}
	if err := c.WriteAt(ctx, buf, oldSize, false); !errors.Is(err, initiator.ErrRange) {
		t.Fatalf("write past the end: %v, want ErrRange", err)
	}

	e.stop()
	if err := e.st.GrowVolume(ctx, "vol0", newSize); err != nil {
		t.Fatal(err)
	}
	e.start(envOpts{addr: addr})

	// The client logs in again on its own; wait for it to (not a timing
	// assertion: the bound only ends a test that would otherwise hang).
	deadline := time.Now().Add(20 * time.Second)
	for c.Size() != newSize {
		if time.Now().After(deadline) {
			t.Fatalf("size after the client logged in again: %d, want %d", c.Size(), newSize)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.WriteAt(ctx, buf, oldSize, false); err != nil {
		t.Fatalf("write past the old end: %v", err)
	}
	got := make([]byte, len(buf))
	if err := c.ReadAt(ctx, got, oldSize); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read past the old end: %v, equal %v", err, bytes.Equal(got, buf))
	}
}
