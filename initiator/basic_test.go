package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/initiator/nbd"
)

// The client is an NBD backend.
var _ nbd.Backend = (*initiator.Client)(nil)

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 77))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func TestBasicIO(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client("host-a", nil)
	ctx := tctx(t)
	if c.Size() != 64<<20 {
		t.Fatalf("size %d", c.Size())
	}
	for _, tc := range []struct {
		name   string
		off, n int64
		fua    bool
	}{
		{"4k aligned", 0, 4096, false},
		{"512 unaligned head", 512, 4096, false},
		{"inside one block", 4096*3 + 1024, 1024, true},
		{"unaligned both ends", 4096*5 + 512, 3 * 4096, false},
		{"grant sized", 1 << 20, 64 << 10, false},
		{"two-step", 2 << 20, 512 << 10, true},
		{"split over max transfer", 4 << 20, 3<<20 + 1536, false},
		{"last block", 64<<20 - 4096, 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]byte, tc.n)
			fill(want, uint64(tc.off))
			if err := c.WriteAt(ctx, want, tc.off, tc.fua); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, tc.n)
			if err := c.ReadAt(ctx, got, tc.off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("read back differs")
			}
		})
	}
	// Neighbours of the unaligned writes are intact: the block around
	// "inside one block" has zeros outside the 1 KiB written.
	blk := make([]byte, 4096)
	if err := c.ReadAt(ctx, blk, 4096*3); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(blk[:1024], make([]byte, 1024)) || !bytes.Equal(blk[2048:], make([]byte, 2048)) {
		t.Fatal("read-modify-write clobbered bytes outside the write")
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Errors.
	if err := c.ReadAt(ctx, make([]byte, 100), 0); !errors.Is(err, initiator.ErrInvalid) {
		t.Fatalf("unaligned length: %v", err)
	}
	if err := c.ReadAt(ctx, make([]byte, 4096), 64<<20); !errors.Is(err, initiator.ErrRange) {
		t.Fatalf("past the end: %v", err)
	}
}

// TestEndedContextStartsNothing: a blocking request whose context has
// already ended is not started, even with the session up: it fails with
// the context's error and the volume is unchanged. (A request replayed
// after a loss runs this path: one whose caller gave up must not run
// later.)
func TestEndedContextStartsNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client("host-a", nil)
	ctx, cancel := context.WithCancel(tctx(t))
	cancel()
	data := bytes.Repeat([]byte{0xab}, 4096)
	if err := c.WriteAt(ctx, data, 8192, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("WriteAt with an ended context: %v, want context.Canceled", err)
	}
	if err := c.WriteZeroes(ctx, 0, 4096, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("WriteZeroes with an ended context: %v, want context.Canceled", err)
	}
	got := make([]byte, 4096)
	if err := c.ReadAt(tctx(t), got, 8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("a write with an ended context reached the volume")
	}
}
