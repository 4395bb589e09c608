package initiator_test

import (
	"bytes"
	"testing"
)

// TestZeroLengthIO: a read or write of no bytes succeeds without a
// command: the protocol has no command of length 0 (the target ends the
// session over one), so sending it would cost the session and, replayed
// after every reconnect, never end.
func TestZeroLengthIO(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client("host-a", nil)
	ctx := tctx(t)
	if err := c.WriteAt(ctx, nil, 4096, false); err != nil {
		t.Fatalf("WriteAt of 0 bytes: %v", err)
	}
	if err := c.ReadAt(ctx, []byte{}, 4096); err != nil {
		t.Fatalf("ReadAt of 0 bytes: %v", err)
	}
	// The client still works after them.
	want := bytes.Repeat([]byte{0x5a}, 4096)
	if err := c.WriteAt(ctx, want, 4096, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := c.ReadAt(ctx, got, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
}
