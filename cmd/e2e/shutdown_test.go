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
			targetAddr, nbdAddr := freePort(t), freePort(t)
			target := start(t, rt, "serve", "--store", "memory", "--listen", targetAddr, "--volume", "vol:64M")
			waitPort(t, targetAddr, target)
			rinit := start(t, ri, "nbd", "--target", targetAddr, "--volume", "vol", "--listen", nbdAddr, "--timeout", "1m")
			waitPort(t, nbdAddr, rinit)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rw := "--rw=read"
			if tc.write {
				rw = "--rw=write" // no fsync: the writes stay unflushed
			}
			if _, out, err := runFio(ctx, "nbd://"+nbdAddr+"/vol", "--name=unflushed", "--size=1M", rw, "--verify=0",
				"--do_verify=0"); err != nil {
				t.Fatalf("fio: %v\n%s", err, out)
			}
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
