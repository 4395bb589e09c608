package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exited waits up to d for p to exit and returns its error; false if it
// is still running.
func exited(p *proc, d time.Duration) (error, bool) {
	select {
	case err := <-p.done:
		p.done <- err
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// TestShutdownTargetGone: stopping rinit nbd after its target died. With
// writes acknowledged since the last flush, rinit tries to flush them (it
// would wait for the target up to --timeout, a minute here); a second
// SIGTERM ends it at once, and its error says which writes may not be
// durable. With nothing unflushed it exits at once. The 10 s it is given
// to exit is not a performance bound: it tells "at once" from "after the
// minute of --timeout".
func TestShutdownTargetGone(t *testing.T) {
	needTools(t, "fio")
	rt, ri := bins(t)
	for _, tc := range []struct {
		name  string
		write bool
	}{{"unflushed writes", true}, {"nothing to flush", false}} {
		t.Run(tc.name, func(t *testing.T) {
			target, rinit, targetAddr := unflushedStack(t, rt, ri, tc.write)
			target.stop(syscall.SIGKILL, 10*time.Second)
			rinit.cmd.Process.Signal(syscall.SIGTERM)
			if !tc.write {
				err, ok := exited(rinit, 10*time.Second)
				if !ok {
					t.Fatalf("rinit with nothing to flush still runs 10 s after SIGTERM:\n%s", rinit.output())
				}
				if err != nil || !strings.Contains(rinit.output(), "every acknowledged write was already flushed") {
					t.Fatalf("rinit exited with %v:\n%s", err, rinit.output())
				}
				return
			}
			waitOutput(t, rinit, "flushing the writes the target acknowledged since the last flush")
			if _, ok := exited(rinit, 0); ok {
				t.Fatalf("rinit exited before the second signal:\n%s", rinit.output())
			}
			rinit.cmd.Process.Signal(syscall.SIGTERM)
			err, ok := exited(rinit, 10*time.Second)
			if !ok {
				t.Fatalf("rinit still runs 10 s after a second SIGTERM:\n%s", rinit.output())
			}
			out := rinit.output()
			if err == nil || !strings.Contains(out, "final flush failed: writes the target "+targetAddr+
				" acknowledged on volume vol since the last flush may not be durable") {
				t.Fatalf("rinit exited with %v; want an error naming the writes that may not be durable:\n%s", err, out)
			}
		})
	}
}

// TestShutdownTogether: rtarget and rinit nbd stopped at the same moment,
// as a host's shutdown stops both services. rinit's final flush then
// races the target's drain: the FLUSH may reach a target that no longer
// answers, whose clean shutdown syncs the writes and says so in its
// GOODBYEs. rinit must take that for the flush it asked for, and exit at
// once and without error; it used to wait for a reconnect up to
// --timeout and then report the writes as possibly lost. The 10 s it is
// given tells "at once" from "after the minute of --timeout".
func TestShutdownTogether(t *testing.T) {
	needTools(t, "fio")
	rt, ri := bins(t)
	for round := range 5 {
		target, rinit, _ := unflushedStack(t, rt, ri, true)
		rinit.cmd.Process.Signal(syscall.SIGTERM)
		target.cmd.Process.Signal(syscall.SIGTERM)
		err, ok := exited(rinit, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: rinit still runs 10 s after SIGTERM, its target stopped cleanly:\n%s", round, rinit.output())
		}
		out := rinit.output()
		if err != nil || strings.Contains(out, "final flush failed") {
			t.Fatalf("round %d: rinit exited with %v:\n%s", round, err, out)
		}
		if err, ok := exited(target, 10*time.Second); !ok || err != nil {
			t.Fatalf("round %d: rtarget: exited %v, err %v:\n%s", round, ok, err, target.output())
		}
		// Which way it went: the GOODBYEs covered the flush, the target
		// answered it, or it came after the GOODBYEs.
		for _, l := range []string{"the target synced the writes as it shut down", "stopped: acknowledged writes flushed",
			"stopped: every acknowledged write was already flushed"} {
			if strings.Contains(out, l) {
				t.Logf("round %d: %s", round, l)
				break
			}
		}
	}
}

// unflushedStack starts rtarget (memory store, volume vol) and rinit nbd
// (--timeout 1m) and has fio read 1 MiB through it, or write it (with no
// fsync: the writes stay unflushed). It returns both processes and the
// target's address.
func unflushedStack(t *testing.T, rt, ri string, write bool) (target, rinit *proc, targetAddr string) {
	t.Helper()
	targetAddr, nbdAddr := freePort(t), freePort(t)
	target = start(t, rt, "serve", "--store", "memory", "--listen", targetAddr, "--volume", "vol:64M")
	waitPort(t, targetAddr, target)
	rinit = start(t, ri, "nbd", "--target", targetAddr, "--volume", "vol", "--listen", nbdAddr, "--timeout", "1m")
	waitPort(t, nbdAddr, rinit)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rw := "--rw=read"
	if write {
		rw = "--rw=write"
	}
	if _, out, err := runFio(ctx, "nbd://"+nbdAddr+"/vol", "--name=unflushed", "--size=1M", rw, "--verify=0",
		"--do_verify=0"); err != nil {
		t.Fatalf("fio: %v\n%s", err, out)
	}
	return target, rinit, targetAddr
}
