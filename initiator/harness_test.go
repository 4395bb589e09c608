package initiator_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

var testSecret = []byte("a pre-shared secret for the tests")

func logger() *slog.Logger {
	if os.Getenv("RNIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is a target serving a store on loopback.
type env struct {
	t      testing.TB
	st     store.Store
	dev    *rnic.Device
	tgt    *target.Target
	l      *rnic.Listener
	addr   string
	served chan error
	cfg    target.Config
}

type envOpts struct {
	thin    bool
	size    int64
	volumes []string
	addr    string // listen address (default 127.0.0.1:0)
	tcfg    func(*target.Config)
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	if o.size == 0 {
		o.size = 64 << 20
	}
	if len(o.volumes) == 0 {
		o.volumes = []string{"vol0"}
	}
	var st store.Store
	if o.thin {
		var err error
		if st, err = store.OpenThin(t.TempDir(), store.ThinOptions{Logger: logger()}); err != nil {
			t.Fatal(err)
		}
	} else {
		st = store.NewMemory()
	}
	ctx := context.Background()
	for _, v := range o.volumes {
		if _, err := st.CreateVolume(ctx, v, o.size, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, st: st}
	t.Cleanup(func() { st.Close() })
	e.start(o)
	return e
}

// start runs a target on e.st (again, after stop).
func (e *env) start(o envOpts) {
	e.t.Helper()
	dev, err := rnic.Open(rnic.Config{Name: "target", Logger: logger()})
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := target.Config{Store: e.st, Device: dev, Secret: target.StaticSecret(testSecret), Logger: logger()}
	if o.tcfg != nil {
		o.tcfg(&cfg)
	}
	tg, err := target.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l *rnic.Listener
	for i := 0; ; i++ { // a port just freed may linger briefly
		if l, err = dev.Listen(addr); err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.dev, e.tgt, e.l, e.addr, e.cfg = dev, tg, l, l.Addr().String(), cfg
	e.served = make(chan error, 1)
	go func() { e.served <- tg.Serve(context.Background(), l) }()
	e.t.Cleanup(e.stop)
}

// stop shuts the target down gracefully (idempotent).
func (e *env) stop() {
	if e.tgt == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.tgt.Shutdown(ctx); err != nil {
		e.t.Errorf("target shutdown: %v", err)
	}
	if err := <-e.served; !errors.Is(err, target.ErrClosed) {
		e.t.Errorf("Serve returned %v", err)
	}
	e.l.Close()
	e.dev.Close()
	e.tgt = nil
}

// client connects an initiator named name.
func (e *env) client(name string, mod func(*initiator.Config)) *initiator.Client {
	e.t.Helper()
	c, err := e.dial(name, mod)
	if err != nil {
		e.t.Fatalf("connect %s: %v", name, err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) dial(name string, mod func(*initiator.Config)) (*initiator.Client, error) {
	cfg := initiator.Config{Addr: e.addr, Volume: "vol0", Initiator: name, Secret: testSecret, Logger: logger()}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return initiator.Connect(ctx, cfg)
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
