package initiator_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/target"
)

// logBuf collects a logger's lines for a test to look at.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// waitLog waits until l holds n lines containing s.
func waitLog(t *testing.T, l *logBuf, s string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); strings.Count(l.String(), s) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines with %q, want %d; log:\n%s", strings.Count(l.String(), s), s, n, l.String())
		}
	}
}

// TestOrderlyClose: a session of several QPs ends with FIN on every one,
// both when the initiator leaves and when the target shuts down: neither
// engine sees a reset (which it logs as a lost stream, and which cut the
// other QPs' GOODBYE at shutdown: the target ended the session, resetting
// them, as soon as the first QP had closed), and the target names the
// right reason.
func TestOrderlyClose(t *testing.T) {
	var tlog logBuf
	e := newEnv(t, envOpts{tcfg: func(c *target.Config) { c.Logger = tlog.logger() }})
	const qps = 3
	for round := range 5 {
		var clog logBuf
		c := e.client("leaver", func(c *initiator.Config) { c.QPs = qps; c.Logger = clog.logger() })
		if err := c.WriteAt(tctx(t), make([]byte, 4096), 0, false); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitLog(t, &tlog, `reason="initiator closed the connection"`, round+1)
		if strings.Contains(clog.String(), "stream lost") {
			t.Fatalf("round %d: the initiator's engine lost a stream as it closed:\n%s\ntarget:\n%s", round, clog.String(), tlog.String())
		}
	}
	addr := e.addr
	var clog logBuf
	c := e.client("stayer", func(c *initiator.Config) { c.QPs = qps; c.Logger = clog.logger() })
	if err := c.WriteAt(tctx(t), make([]byte, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	e.stop()
	waitLog(t, &clog, "target says goodbye", qps)
	waitLog(t, &tlog, `reason="target shutdown"`, 1)
	if strings.Contains(clog.String(), "stream lost") {
		t.Fatalf("the initiator's engine lost a stream at the target's shutdown:\n%s", clog.String())
	}
	if s := tlog.String(); strings.Contains(s, "connection lost") || strings.Contains(s, "work outstanding") {
		t.Fatalf("the target reset a QP:\n%s", s)
	}
	// Every QP had its synced GOODBYE, so the write made before the
	// shutdown is known durable: once the client is back on the restarted
	// target, its Flush reports no loss (ErrWritesLost).
	e.start(envOpts{addr: addr})
	waitLog(t, &clog, "session re-established", 1)
	if err := c.Flush(tctx(t)); err != nil {
		t.Fatalf("flush after a clean restart: %v", err)
	}
}

// TestFlushDuringShutdown: a Flush racing the target's clean shutdown
// returns nil. The target drains (a FLUSH that arrives then gets no
// answer) and syncs, and says so in a GOODBYE on every QP; the Flush,
// which has to wait for the next session, takes those GOODBYEs for the
// flush it asked for instead of waiting for a target that is gone.
func TestFlushDuringShutdown(t *testing.T) {
	var tlog logBuf
	tcfg := func(c *target.Config) { c.Logger = tlog.logger() }
	e := newEnv(t, envOpts{tcfg: tcfg})
	addr := e.addr
	var clog logBuf
	c := e.client("flusher", func(c *initiator.Config) { c.QPs = 2; c.Logger = clog.logger() })
	for round := range 10 {
		if round > 0 {
			e.start(envOpts{addr: addr, tcfg: tcfg})
			waitLog(t, &clog, "session re-established", round)
		}
		if err := c.WriteAt(tctx(t), make([]byte, 4096), int64(round)*4096, false); err != nil {
			t.Fatal(err)
		}
		if !c.Unflushed() {
			t.Fatalf("round %d: a write without FUA left nothing to flush", round)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		done := make(chan error, 1)
		go func() { done <- c.Flush(ctx) }()
		e.stop()
		if err := <-done; err != nil {
			t.Fatalf("round %d: Flush racing a clean shutdown: %v\ninitiator:\n%s\ntarget:\n%s", round, err, clog.String(), tlog.String())
		}
		cancel()
		if c.Unflushed() {
			t.Fatalf("round %d: writes left unflushed after the Flush", round)
		}
	}
	t.Logf("covered by the GOODBYEs in %d of 10 rounds", strings.Count(clog.String(), "the target synced the writes as it shut down"))
}

// TestCleanRestartUnderLoad: a target restarted cleanly while writes are
// in flight on every QP. Its GOODBYE on each QP says that what it
// acknowledged is durable, so the first Flush on the restarted target
// reports no loss (ErrWritesLost). A QP busy with a write the draining
// target left unanswered used to be reset by the session's close before
// its own GOODBYE arrived, and the Flush then reported writes lost that
// were not.
func TestCleanRestartUnderLoad(t *testing.T) {
	e := newEnv(t, envOpts{})
	addr := e.addr
	var clog logBuf
	c := e.client("loader", func(c *initiator.Config) { c.QPs = 3; c.Logger = clog.logger() })
	for round := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var acked atomic.Int64
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 4096)
				for i := 0; ctx.Err() == nil; i++ {
					// Errors are expected once the target goes (and the
					// writes replay on the new session, or ctx ends them).
					if c.WriteAt(ctx, buf, int64(w*64+i%64)*4096, false) == nil {
						acked.Add(1)
					}
				}
			}()
		}
		for acked.Load() < 200 {
			time.Sleep(time.Millisecond)
		}
		e.stop()
		e.start(envOpts{addr: addr})
		waitLog(t, &clog, "session re-established", round+1)
		cancel()
		wg.Wait()
		if err := c.Flush(tctx(t)); err != nil {
			t.Fatalf("round %d: flush after a clean restart under load: %v\n%s", round, err, clog.String())
		}
	}
	// A clean restart is no fault: nothing of it is worth a warning.
	if strings.Contains(clog.String(), "level=WARN") {
		t.Fatalf("warnings in a clean restart:\n%s", clog.String())
	}
}
