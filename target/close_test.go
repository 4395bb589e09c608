package target

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
)

// goroutineWith reports whether the stack of some goroutine holds every
// one of frames.
func goroutineWith(frames ...string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
next:
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		for _, f := range frames {
			if !bytes.Contains(g, []byte(f)) {
				continue next
			}
		}
		return true
	}
	return false
}

// shutdownParked reports whether a goroutine is parked in a
// WaitGroup.Wait called from Target.Shutdown itself.
func shutdownParked() bool {
	return goroutineWith("sync.(*WaitGroup).Wait(", "target.(*Target).Shutdown(")
}

// TestCloseWaitsForEndingSession: a session whose initiator went away
// ends in a goroutine of its own. Close must wait for that teardown: the
// caller closes the RNIC device next, and QPs, CQs and PDs released after
// that fail ("destroy CQ: CQ in use ... PD in use"), and the volume
// handle would be closed after its store. The session's teardown is
// held here by a FLUSH its worker is executing (the store's Flush waits
// for the test's gate); the gate opens only once Close waits, or once it
// returned (then too early).
func TestCloseWaitsForEndingSession(t *testing.T) {
	var g *gatedStore
	r := newRig(t, func(c *Config) {
		g = &gatedStore{Store: c.Store, flushing: make(chan struct{}), gate: make(chan struct{})}
		c.Store = g
	})
	p := r.dial(4, 0)
	sess := r.session()
	c := r.conn0()
	p.command(blockproto.CommandFields{Op: blockproto.OpFlush}, 0, false)
	<-g.flushing
	gateOpen := false
	defer func() {
		if !gateOpen {
			close(g.gate)
		}
		r.waitFor("the session to end", r.noSession)
	}()

	// The initiator goes away: the session's teardown stops the QP's
	// endpoint and then waits for the worker in Flush.
	p.ep.Close(nil)
	r.waitFor("the session's teardown to stop the QP", func() bool {
		sess.mu.Lock()
		ended := sess.ended
		sess.mu.Unlock()
		return ended && c.Context().Err() != nil
	})
	if r.tgt.m.SessionsActive.Load() != 1 {
		t.Fatalf("SessionsActive %d before Close, want 1 (the session ending)", r.tgt.m.SessionsActive.Load())
	}

	closed := make(chan error, 1)
	go func() { closed <- r.tgt.Close() }()
	var err error
	for waiting := true; waiting; {
		select {
		case err = <-closed:
			waiting = false
		default:
			if !gateOpen && shutdownParked() {
				close(g.gate)
				gateOpen = true
			}
			runtime.Gosched()
		}
	}
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n, q := r.tgt.m.SessionsActive.Load(), r.tgt.m.QPsActive.Load(); n != 0 || q != 0 {
		t.Fatalf("Close returned with %d sessions and %d QPs still being torn down", n, q)
	}
}
