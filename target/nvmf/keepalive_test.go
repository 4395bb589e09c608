package nvmf

import (
	"testing"
	"time"
)

// TestKeepAlive: a host that keeps sending Keep Alive keeps its
// controller; one that goes silent loses it, with all its queues, after
// its keep alive timeout; Set Features KATO changes the timeout.
func TestKeepAlive(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	live := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{kato: 300})
	silent := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{kato: 300})
	start := time.Now()
	for time.Since(start) < time.Second {
		if r, _, err := live.admin.do(CommandFields{Opcode: AdminKeepAlive}, cmdOpts{}); err != nil || r.status() != StatusSuccess {
			t.Fatalf("keep alive: %v %v", r.status(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, q := range append([]*hostQueue{silent.admin}, silent.io...) {
		if err := q.waitLost(3 * time.Second); err != nil {
			t.Fatalf("silent host: %v", err)
		}
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("dropped after %v, before its timeout", d)
	}
	if e.srv.m.KeepAliveExpired.Load() != 1 {
		t.Fatalf("%d controllers expired, want 1", e.srv.m.KeepAliveExpired.Load())
	}
	if _, st, err := live.read(0, 0, 1); err != nil || st != StatusSuccess {
		t.Fatalf("the live host's I/O: %v %v", st, err)
	}
	// KATO through Set Features; Get Features reads it back.
	f := CommandFields{Opcode: AdminSetFeatures, CDW10_15: [6]uint32{FeatKATO, 60000}}
	if r, _, err := live.admin.do(f, cmdOpts{}); err != nil || r.status() != StatusSuccess {
		t.Fatalf("set KATO: %v %v", r.status(), err)
	}
	if r, _, err := live.admin.do(CommandFields{Opcode: AdminGetFeatures, CDW10_15: [6]uint32{FeatKATO}}, cmdOpts{}); err != nil ||
		r.result() != 60000 {
		t.Fatalf("get KATO: %v %v", r.result(), err)
	}
	time.Sleep(700 * time.Millisecond)
	if _, st, err := live.read(0, 0, 1); err != nil || st != StatusSuccess {
		t.Fatalf("after a longer KATO: %v %v", st, err)
	}
}

// TestKeepAliveStaleTimer: the callback of a timer that fired just as Set
// Features KATO re-armed it (it was waiting for the controller's lock)
// leaves the controller alone. It used to find no command since the
// re-arming, which had just reset the period's activity, and drop the
// controller at once. The late callback is called here directly, after
// the re-arming, as it would run.
func TestKeepAliveStaleTimer(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{kato: 60000})
	c := e.srv.controller(h.cntlid)
	if c == nil {
		t.Fatalf("no controller %d", h.cntlid)
	}
	c.mu.Lock()
	stale := c.kaArmed
	c.setKeepAliveLocked(time.Hour) // Set Features KATO, as its command does
	c.mu.Unlock()
	c.checkKeepAlive(stale)
	if n := e.srv.m.KeepAliveExpired.Load(); n != 0 {
		t.Fatalf("%d controllers expired by a stale timer", n)
	}
	if r, _, err := h.admin.do(CommandFields{Opcode: AdminKeepAlive}, cmdOpts{}); err != nil || r.status() != StatusSuccess {
		t.Fatalf("keep alive after the stale timer: %v %v", r.status(), err)
	}
	// The current arming's callback still does its work: with no command
	// since it was armed, it drops the controller.
	c.mu.Lock()
	c.setKeepAliveLocked(time.Hour)
	current := c.kaArmed
	c.mu.Unlock()
	c.checkKeepAlive(current)
	if err := h.admin.waitLost(10 * time.Second); err != nil {
		t.Fatalf("current timer: %v", err)
	}
	if n := e.srv.m.KeepAliveExpired.Load(); n != 1 {
		t.Fatalf("%d controllers expired, want 1", n)
	}
}
