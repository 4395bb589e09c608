package initiator_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// TestLoginRefusals: a wrong secret, an unknown volume, a malformed
// snapshot reference and an empty secret are refused with clear errors, and nothing was logged in.
func TestLoginRefusals(t *testing.T) {
	e := newEnv(t, envOpts{})
	_, err := e.dial("mallory", func(c *initiator.Config) { c.Secret = []byte("not the secret at all") })
	var le *initiator.LoginError
	if !errors.As(err, &le) || le.Status != blockproto.StatusAuth {
		t.Fatalf("wrong secret: %v", err)
	}
	t.Logf("wrong secret: %v", err)
	_, err = e.dial("mallory", func(c *initiator.Config) { c.Volume = "nope" })
	if !errors.As(err, &le) || le.Status != blockproto.StatusNoVolume {
		t.Fatalf("unknown volume: %v", err)
	}
	t.Logf("unknown volume: %v", err)
	// "vol0@" is no reference to vol0 (a snapshot's name left empty, as by
	// an unset shell variable): serving vol0 itself would make a
	// read-only export writable.
	for _, ref := range []string{"vol0@", "@vol0", "vol0@a@b"} {
		_, err = e.dial("mallory", func(c *initiator.Config) { c.Volume = ref })
		if !errors.As(err, &le) || le.Status != blockproto.StatusInvalid {
			t.Fatalf("volume %q: %v", ref, err)
		}
		t.Logf("volume %q: %v", ref, err)
	}
	if _, err = e.dial("mallory", func(c *initiator.Config) { c.Secret = nil }); err == nil {
		t.Fatal("empty secret accepted")
	}
	t.Logf("no secret: %v", err)
	// The honest initiator still gets in.
	c := e.client("alice", nil)
	if err := c.WriteAt(tctx(t), make([]byte, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
}

// TestDeadSessionReleasesLocksAndFences: a lock holder whose RNIC dies (its
// connections reset, no goodbye) loses its numbered lock and reservation;
// the generation moves, so its fencing token is stale for everybody, and a
// new holder's token works.
func TestDeadSessionReleasesLocksAndFences(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := tctx(t)
	cfg := rnic.DefaultConfig()
	cfg.Logger = logger()
	dev, err := rnic.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := e.client("doomed", func(c *initiator.Config) { c.Device = dev; c.NoReconnect = true })
	b := e.client("survivor", nil)
	lk, err := a.Lock(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(ctx, true); err != nil {
		t.Fatal(err)
	}
	stale := lk.Token()
	if err := a.WriteAtToken(ctx, bytes.Repeat([]byte{1}, 4096), 0, false, stale); err != nil {
		t.Fatalf("holder's fenced write: %v", err)
	}
	if _, err := b.TryLock(ctx, 3); err == nil {
		t.Fatal("lock 3 taken twice")
	}
	dev.Close() // the holder dies: every stream reset

	// The target notices the reset, clears the holder's slot and bumps the
	// generation; the survivor then gets the lock.
	var lb *initiator.Lock
	deadline := time.Now().Add(20 * time.Second)
	for {
		if lb, err = b.TryLock(ctx, 3); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock 3 never released after its holder died: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, holders, err := b.ReservationHolders(ctx); err != nil || len(holders) != 0 {
		t.Fatalf("reservation after the holder died: %v %v", holders, err)
	}
	// The dead holder's token is stale: a write carrying it (replayed or
	// delayed) changes nothing.
	err = b.WriteAtToken(ctx, bytes.Repeat([]byte{2}, 4096), 0, false, stale)
	var se *initiator.StatusError
	if !errors.As(err, &se) || se.Status != blockproto.StatusStaleToken {
		t.Fatalf("write with the dead holder's token: %v", err)
	}
	got := make([]byte, 4096)
	if err := b.ReadAt(ctx, got, 0); err != nil || got[0] != 1 {
		t.Fatalf("stale write landed (byte %d, err %v)", got[0], err)
	}
	if lb.Token() <= stale {
		t.Fatalf("new token %d not above the stale %d", lb.Token(), stale)
	}
	if err := b.WriteAtToken(ctx, bytes.Repeat([]byte{3}, 4096), 0, false, lb.Token()); err != nil {
		t.Fatalf("new holder's fenced write: %v", err)
	}
	// A token never issued is refused too.
	err = b.WriteAtToken(ctx, make([]byte, 4096), 0, false, lb.Token()+1000)
	if !errors.As(err, &se) || se.Status != blockproto.StatusStaleToken {
		t.Fatalf("write with a future token: %v", err)
	}
	if _, err := a.ReadOnly(), a.WriteAt(ctx, make([]byte, 4096), 0, false); err == nil {
		t.Fatal("the dead client still writes")
	}
}

// TestReconnectReplay: the target restarts (same store, same address)
// while writers (blocking WriteAt, and StartWrite) have requests in flight. The initiator reconnects and
// replays what was not acknowledged; every write returns success or an
// error, and every successful write is there afterwards.
func TestReconnectReplay(t *testing.T) {
	e := newEnv(t, envOpts{thin: true, size: 64 << 20, addr: "127.0.0.1:0"})
	addr := e.addr
	c := e.client("replayer", func(c *initiator.Config) {
		c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
	})
	ctx := tctx(t)
	const writers, perWriter = 4, 60
	var mu sync.Mutex
	written := map[int64][]byte{}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; i < perWriter; i++ {
				off := int64(w*perWriter+i) * 8192
				buf := make([]byte, 8192)
				for j := range buf {
					buf[j] = byte(r.Uint32())
				}
				var err error
				if w%2 == 0 {
					err = c.WriteAt(ctx, buf, off, false)
				} else { // StartWrite: the replay happens behind the callback
					done := make(chan error, 1)
					c.StartWrite(ctx, buf, off, false, initiator.CompletionFunc(func(err error) { done <- err }))
					err = <-done
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				written[off] = buf
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}(w)
	}
	time.Sleep(40 * time.Millisecond)
	e.stop() // graceful: GOODBYE, sync
	e.start(envOpts{addr: addr})
	time.Sleep(40 * time.Millisecond)
	e.stop()
	e.start(envOpts{addr: addr})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a write failed across the restarts: %v", err)
	}
	// When the initiator cannot prove the old target synced before it went
	// (no GOODBYE with the synced flag reached it), the first Flush says
	// that acknowledged writes may have been lost; it is reported once.
	if err := c.Flush(ctx); err != nil {
		t.Logf("first flush after the restarts: %v", err)
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 8192)
	i := 0
	for off, want := range written {
		i++
		if i%2 == 0 {
			if err := c.ReadAt(ctx, got, off); err != nil {
				t.Fatal(err)
			}
		} else {
			done := make(chan error, 1)
			c.StartRead(ctx, got, off, initiator.CompletionFunc(func(err error) { done <- err }))
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block at %d differs after the restarts", off)
		}
	}
	t.Logf("%d writes across two target restarts, all acknowledged and all read back", len(written))
}

// TestFlushIsDurable: data acknowledged by a FLUSH survives the target
// dying without a sync or a close: the target (thin store) runs in a
// child process that is killed with SIGKILL after the Flush and after a
// later, unflushed write; the store is then opened again from its
// directory. The flushed block must read back exactly; the unflushed one
// may hold either version.
func TestFlushIsDurable(t *testing.T) {
	if dir := os.Getenv(flushChildEnv); dir != "" {
		flushChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFlushIsDurable$", "-test.count=1")
	cmd.Env = append(os.Environ(), flushChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var addr string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "TARGET "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatalf("the child target did not start: %v", sc.Err())
	}
	go io.Copy(io.Discard, out)

	ctx := tctx(t)
	c, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "vol0", Initiator: "durable", Secret: testSecret,
		Logger: logger(), NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := bytes.Repeat([]byte("durable!"), 512)
	if err := c.WriteAt(ctx, want, 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	later := bytes.Repeat([]byte("unflushd"), 512)
	if err := c.WriteAt(ctx, later, 8192, false); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	st, err := store.OpenThin(dir, store.ThinOptions{Logger: logger()})
	if err != nil {
		t.Fatalf("reopen after SIGKILL: %v", err)
	}
	defer st.Close()
	v, err := st.OpenVolume(ctx, "vol0")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	got := make([]byte, 2*4096)
	if err := v.ReadBlocks(ctx, 1, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], want) {
		t.Fatal("the flushed block did not survive the target's SIGKILL")
	}
	switch {
	case bytes.Equal(got[4096:], later):
		t.Log("flushed block intact after SIGKILL; the unflushed write survived too")
	case bytes.Equal(got[4096:], make([]byte, 4096)):
		t.Log("flushed block intact after SIGKILL; the unflushed write was lost (allowed)")
	default:
		t.Fatal("the unflushed block holds neither its old nor its new content")
	}
}

const flushChildEnv = "RNIC_FLUSH_CHILD_DIR"

// flushChild runs a target over a thin store in dir and prints its
// address; it runs until killed.
func flushChild(t *testing.T, dir string) {
	st, err := store.OpenThin(dir, store.ThinOptions{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateVolume(context.Background(), "vol0", 64<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dev, err := rnic.Open(rnic.Config{Name: "target", Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Store: st, Device: dev, Secret: target.StaticSecret(testSecret), Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("TARGET %s\n", l.Addr())
	tg.Serve(context.Background(), l)
	select {} // until SIGKILL
}
