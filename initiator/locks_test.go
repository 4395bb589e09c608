package initiator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
)

// TestAtomicsOnEveryQP draws many fencing tokens: the session spreads them
// over all its QPs, and each must address the lock table through the STag
// registered for that QP (its own protection domain). Tokens are unique.
func TestAtomicsOnEveryQP(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client("tok", func(c *initiator.Config) { c.QPs = 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[uint64]bool{}
	for i := 0; i < 64; i++ {
		tok, err := c.Token(ctx)
		if err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if seen[tok] {
			t.Fatalf("token %d repeated", tok)
		}
		seen[tok] = true
	}
	if _, held, err := c.LockHolder(ctx, 3); err != nil || held {
		t.Fatalf("lock 3 status: held=%v err=%v", held, err)
	}
}

// TestLockContention: N initiators each add 1 to a counter block M times
// under numbered lock 7. The final value is exactly N*M.
func TestLockContention(t *testing.T) {
	const n, m = 4, 25
	e := newEnv(t, envOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := make([]*initiator.Client, n)
	for i := range clients {
		clients[i] = e.client("host-"+string(rune('a'+i)), nil)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for j := 0; j < m; j++ {
				l, err := c.Lock(ctx, 7)
				if err != nil {
					errs <- err
					return
				}
				if err := c.ReadAt(ctx, buf, 0); err != nil {
					errs <- err
					return
				}
				binary.LittleEndian.PutUint64(buf, binary.LittleEndian.Uint64(buf)+1)
				if err := c.WriteAtToken(ctx, buf, 0, false, l.Token()); err != nil {
					errs <- err
					return
				}
				if err := l.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := clients[0].ReadAt(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(buf); got != n*m {
		t.Fatalf("counter %d, want %d", got, n*m)
	}
}

// TestReservationBlocksOthers: an exclusive reservation refuses another
// initiator's writes with an error naming the holder, and the refused write
// changes nothing: the block still holds the holder's data (distinct
// patterns), read back by both initiators.
func TestReservationBlocksOthers(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := e.client("alpha", nil)
	b := e.client("beta", nil)
	r, err := a.Reserve(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	alphaData := bytes.Repeat([]byte("alpha holds this block. "), 4096/24+1)[:4096]
	betaData := bytes.Repeat([]byte{0xBE, 0x7A}, 2048)
	if err := a.WriteAt(ctx, alphaData, 0, false); err != nil {
		t.Fatalf("holder's write: %v", err)
	}
	err = b.WriteAt(ctx, betaData, 0, false)
	var re *initiator.ReservedError
	if !errors.As(err, &re) || re.Holder != "alpha" {
		t.Fatalf("other's write: %v", err)
	}
	t.Logf("refused: %v", err)
	back := make([]byte, 4096)
	for _, c := range []struct {
		name string
		c    *initiator.Client
	}{{"alpha", a}, {"beta", b}} {
		if err := c.c.ReadAt(ctx, back, 0); err != nil {
			t.Fatalf("%s reads the block back: %v", c.name, err)
		}
		if !bytes.Equal(back, alphaData) {
			t.Fatalf("after the refused write %s reads %q..., want the holder's %q...", c.name, back[:16], alphaData[:16])
		}
	}
	excl, holders, err := b.ReservationHolders(ctx)
	if err != nil || !excl || len(holders) != 1 || holders[0] != "alpha" {
		t.Fatalf("status: %v %v %v", excl, holders, err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteAt(ctx, betaData, 0, false); err != nil {
		t.Fatalf("write after release: %v", err)
	}
	if err := a.ReadAt(ctx, back, 0); err != nil || !bytes.Equal(back, betaData) {
		t.Fatalf("after the release beta's write reads back as %x... (%v)", back[:8], err)
	}
}
