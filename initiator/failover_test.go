package initiator_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/target"
)

// freezer is a TCP proxy in front of a target that can stop forwarding
// bytes while keeping every connection open: what an initiator sees of a
// target process that was SIGSTOPped.
type freezer struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	thaw  chan struct{}
	conns []net.Conn
}

func newFreezer(t *testing.T, to string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, to: to}
	t.Cleanup(f.close)
	go f.accept()
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", f.to)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, u)
		f.mu.Unlock()
		go f.pipe(c, u)
		go f.pipe(u, c)
	}
}

// pipe copies src to dst, holding every chunk while frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thaw := f.thaw
			f.mu.Unlock()
			if thaw != nil {
				<-thaw
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	f.thaw = make(chan struct{})
	f.mu.Unlock()
}

func (f *freezer) close() {
	f.ln.Close()
	f.mu.Lock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
	}
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

// second starts another target on the same store: a second gateway.
func (e *env) second(t *testing.T) string {
	dev, err := rnic.Open(rnic.Config{Name: "target-b", Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Store: e.st, Device: dev, Secret: target.StaticSecret(testSecret), Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(t.Context(), l)
	t.Cleanup(func() {
		tg.Close()
		l.Close()
		dev.Close()
	})
	return l.Addr().String()
}

// TestFailoverStoppedTarget: the first target stops answering (its
// connections stay open, as a SIGSTOPped process's do); the heartbeat
// drops the session and the client moves to the second target, replaying
// what was in flight. Every write lands and reads back.
func TestFailoverStoppedTarget(t *testing.T) {
	e := newEnv(t, envOpts{})
	b := e.second(t)
	fz := newFreezer(t, e.addr)
	c := e.client("failover", func(c *initiator.Config) {
		c.Addr = fz.addr() + "," + b
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, time.Second
	})
	ctx := tctx(t)
	data := bytes.Repeat([]byte{0xa5}, 64<<10)
	if err := c.WriteAt(ctx, data, 0, false); err != nil {
		t.Fatal(err)
	}
	fz.freeze()
	start := time.Now()
	data2 := bytes.Repeat([]byte{0x5a}, 64<<10)
	if err := c.WriteAt(ctx, data2, 1<<20, true); err != nil {
		t.Fatalf("write while the first target is stopped: %v", err)
	}
	t.Logf("write completed through the second target after %v", time.Since(start))
	got := make([]byte, len(data))
	for off, want := range map[int64][]byte{0: data, 1 << 20: data2} {
		if err := c.ReadAt(ctx, got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("data at %d differs after failover", off)
		}
	}
}

// TestFailoverDeadTarget: the first target is gone (connection refused at
// login, then reset mid-session); the client logs in to the second.
func TestFailoverDeadTarget(t *testing.T) {
	e := newEnv(t, envOpts{})
	b := e.second(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	// At Connect: the first address refuses.
	c := e.client("failover", func(c *initiator.Config) { c.Addr = deadAddr + "," + e.addr + "," + b })
	ctx := tctx(t)
	data := bytes.Repeat([]byte{0x33}, 8192)
	if err := c.WriteAt(ctx, data, 0, false); err != nil {
		t.Fatal(err)
	}
	// Mid-session: the serving target goes away.
	e.stop()
	if err := c.WriteAt(ctx, data, 8192, true); err != nil {
		t.Fatalf("write after the target went away: %v", err)
	}
	got := make([]byte, 16384)
	if err := c.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8192], data) || !bytes.Equal(got[8192:], data) {
		t.Fatal("data differs after failover")
	}
}
