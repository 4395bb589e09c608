package endpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic"
)

// pair connects two endpoints over loopback TCP, each on its own RNIC.
func pair(t *testing.T, cfg Config) (a, b *Endpoint) {
	t.Helper()
	return pairWith(t, cfg, nil)
}

// pairWith is pair with adjust (if not nil) changing side i's Config on
// device d before its endpoint is made.
func pairWith(t *testing.T, cfg Config, adjust func(i int, d *rnic.Device, c *Config)) (a, b *Endpoint) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var devs [2]*rnic.Device
	for i := range devs {
		d, err := rnic.Open(rnic.Config{Name: fmt.Sprint("ep", i), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	var eps [2]*Endpoint
	for i := range eps {
		c := cfg
		c.Device = devs[i]
		if adjust != nil {
			adjust(i, devs[i], &c)
		}
		e, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(nil) })
		eps[i] = e
	}
	l, err := devs[1].Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			_, err = req.Accept(ctx, eps[1].QP, rnic.AcceptParams{})
		}
		accepted <- err
	}()
	if _, err := devs[0].Connect(ctx, eps[0].QP, l.Addr().String(), rnic.ConnParams{}); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	return eps[0], eps[1]
}

func testConfig() Config {
	return Config{QP: rnic.QPConfig{SQDepth: 64}, Receives: 8, RecvSize: 256, SendAreas: 8, SendSize: 256}
}

// TestEndpointMessages: messages sent from the send areas land in the
// receive ring in order; the loop hands them to the handler, which
// reposts the buffers, so more messages than buffers get through.
func TestEndpointMessages(t *testing.T) {
	a, b := pair(t, testConfig())
	const n = 100
	got := make(chan string, n)
	b.Start(func(wcs []rnic.WC) bool {
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != rnic.StatusSuccess {
				return false
			}
			got <- string(b.Received(wc))
			if err := b.Repost(int(wc.ID)); err != nil {
				t.Error(err)
				return false
			}
		}
		return true
	})
	for i := 0; i < n; i++ {
		k := i % 8
		m := copy(a.Area(k), fmt.Sprintf("message %d", i))
		if _, err := a.QP.PostSend(rnic.SendWR{ID: uint64(i), Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{a.AreaSGE(k, m)}}); err != nil {
			t.Fatal(err)
		}
		// The area is reused eight messages later, and the peer has
		// eight receives: wait for this one to be delivered.
		if s := <-got; s != fmt.Sprintf("message %d", i) {
			t.Fatalf("received %q, want message %d", s, i)
		}
	}
}

// TestEndpointCloseOrder: Close resets the connection, waits until the QP
// is stopped and the loop has returned, then calls release, then frees;
// the peer's loop sees its connection end.
func TestEndpointCloseOrder(t *testing.T) {
	a, b := pair(t, testConfig())
	var loopDone atomic.Bool
	a.Start(func(wcs []rnic.WC) bool {
		for _, wc := range wcs {
			if wc.Status != rnic.StatusSuccess {
				loopDone.Store(true)
				return false
			}
		}
		return true
	})
	peerEnded := make(chan rnic.Status, 1)
	b.Start(func(wcs []rnic.WC) bool {
		for _, wc := range wcs {
			if wc.Status != rnic.StatusSuccess {
				peerEnded <- wc.Status
				return false
			}
		}
		return true
	})
	released := false
	err := a.Close(func() {
		if st := a.QP.State(); st != rnic.StateError && st != rnic.StateIdle {
			t.Errorf("release ran with the QP in %s", st)
		}
		if !loopDone.Load() {
			t.Error("release ran before the loop returned")
		}
		released = true
	})
	if err != nil || !released {
		t.Fatalf("Close: %v, release called %v", err, released)
	}
	if err := a.Close(nil); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := a.PD.Dealloc(); err == nil {
		t.Fatal("the endpoint's own PD is still allocated after Close")
	}
	select {
	case <-peerEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's loop never saw the connection end")
	}
}

// TestEndpointKillFromHandler: the handler may Kill its own endpoint;
// Close then completes.
func TestEndpointKillFromHandler(t *testing.T) {
	a, b := pair(t, testConfig())
	b.Start(func(wcs []rnic.WC) bool {
		b.Kill()
		return true
	})
	m := copy(a.Area(0), "bye")
	if _, err := a.QP.PostSend(rnic.SendWR{Op: rnic.WRSend, SGL: []rnic.SGE{a.AreaSGE(0, m)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.QP.WaitState(ctx, rnic.StateError); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(nil); err != nil {
		t.Fatal(err)
	}
}

// registrations names each way of registering through an endpoint.
var registrations = []struct {
	name string
	reg  func(e *Endpoint) (*rnic.MR, error)
}{
	{"Register", func(e *Endpoint) (*rnic.MR, error) { return e.Register(make([]byte, 64), rnic.LocalWrite) }},
	{"RegisterMR", func(e *Endpoint) (*rnic.MR, error) {
		return e.RegisterMR(rnic.Bytes(make([]byte, 64)), rnic.MROptions{Access: rnic.LocalWrite, ZeroBased: true})
	}},
	{"AllocSTag", func(e *Endpoint) (*rnic.MR, error) { return e.AllocSTag(true) }},
}

// TestRegisterAfterClose: a registration through an endpoint whose Close
// has run fails with ErrClosed and leaves nothing registered, even in a PD
// the endpoint shares with others (which Close does not free): the caller
// fails cleanly instead of holding a region no one will deregister.
func TestRegisterAfterClose(t *testing.T) {
	var pd *rnic.PD
	a, _ := pairWith(t, testConfig(), func(i int, d *rnic.Device, c *Config) {
		if i == 0 {
			var err error
			if pd, err = d.AllocPD(); err != nil {
				t.Fatal(err)
			}
			c.PD = pd
		}
	})
	if err := a.Close(nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range registrations {
		mr, err := r.reg(a)
		if mr != nil {
			info, qerr := mr.Query()
			t.Errorf("%s after Close: %v, region %s registered (valid %v, query error %v)", r.name, err, mr.STag(), info.Valid, qerr)
		} else if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", r.name, err)
		}
	}
	if err := pd.Dealloc(); err != nil {
		t.Errorf("the shared PD after Close: %v", err)
	}
}

// TestRegisterDuringClose: registrations racing Close (a QP that joins a
// session while the session ends) are either freed by Close or refused
// with ErrClosed; none outlives the endpoint or keeps its own PD from
// being freed (Close's error says so).
func TestRegisterDuringClose(t *testing.T) {
	a, _ := pair(t, testConfig())
	var mrs []*rnic.MR
	stop := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			mr, err := registrations[i%len(registrations)].reg(a)
			if err != nil {
				stop <- err
				return
			}
			mrs = append(mrs, mr)
			if i == 0 {
				close(started)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	select {
	case <-started:
	case err := <-stop:
		t.Fatalf("registering before Close: %v", err)
	}
	if err := a.Close(nil); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-stop; !errors.Is(err, ErrClosed) {
		t.Errorf("the registration after Close: %v, want ErrClosed", err)
	}
	var left []rnic.STag
	for _, mr := range mrs {
		if _, err := mr.Query(); err == nil {
			left = append(left, mr.STag())
		}
	}
	if len(left) > 0 {
		t.Errorf("%d of the %d regions registered outlived Close (the first: %s)", len(left), len(mrs), left[0])
	}
}

// TestStartRacingClose: a Close on one goroutine and a Start on another
// (a server's shutdown ending a queue its accept is still starting) are
// ordered: either the loop started and Close stopped and waited for it,
// or Start came second and started nothing. The race detector checks the
// ordering; the handler must never run once Close has returned.
func TestStartRacingClose(t *testing.T) {
	for i := range 20 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			a, _ := pair(t, testConfig())
			var closed atomic.Bool
			var late atomic.Int32
			start := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				<-start
				a.Start(func(wcs []rnic.WC) bool {
					if closed.Load() {
						late.Add(1)
					}
					return true
				})
			}()
			close(start)
			if err := a.Close(nil); err != nil {
				t.Errorf("Close: %v", err)
			}
			closed.Store(true)
			<-done
			// A Start that came second left nothing running: the CQ it
			// would poll is gone, and so is the loop.
			time.Sleep(time.Millisecond)
			if n := late.Load(); n != 0 {
				t.Errorf("the handler ran %d times after Close returned", n)
			}
		})
	}
}
