package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/childproc"
)

// runAsRtargetEnv makes this test binary rtarget itself (TestMain runs
// main), so that the tests about what rtarget does as a process (its exit
// status, its signals, its files) run it as one without a build of their
// own.
const runAsRtargetEnv = "RNIC_TEST_RUN_AS_RTARGET"

func TestMain(m *testing.M) {
	if os.Getenv(runAsRtargetEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rtargetCmd returns the command running rtarget with args, stopped by
// SIGKILL should the test process die first.
func rtargetCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), runAsRtargetEnv+"=1")
	childproc.DieWithParent(cmd, syscall.SIGKILL)
	return cmd
}

// exitStatus is the exit status of a command that ran to its end (-1 for
// one killed by a signal or that did not start).
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// execRtarget runs rtarget args as a process to its end.
func execRtarget(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	cmd := rtargetCmd(t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if status = exitStatus(err); status < 0 {
		t.Fatalf("rtarget %q: %v\n%s", args, err, errb.String())
	}
	return out.String(), errb.String(), status
}

// daemon is a running rtarget serve with its log.
type daemon struct {
	t    *testing.T
	cmd  *exec.Cmd
	log  syncBuffer
	done chan error // the result of Wait, put back by whoever reads it
}

// startDaemon starts cmd (rtargetCmd's, of serve) and stops it with
// SIGKILL when the test ends, if it still runs.
func startDaemon(t *testing.T, cmd *exec.Cmd) *daemon {
	t.Helper()
	d := &daemon{t: t, cmd: cmd, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = &d.log, &d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-d.done:
			d.done <- err
		default:
			cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("rtarget serve's log:\n%s", d.log.String())
		}
	})
	return d
}

// startServe starts rtarget serve with args.
func startServe(t *testing.T, args ...string) *daemon {
	t.Helper()
	return startDaemon(t, rtargetCmd(t, append([]string{"serve"}, args...)...))
}

// waitLog waits (up to 30 s) for a log line holding every one of want
// and returns it; it fails the test if the daemon exits first.
func (d *daemon) waitLog(want ...string) string {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sc := bufio.NewScanner(strings.NewReader(d.log.String()))
	lines:
		for sc.Scan() {
			for _, w := range want {
				if !strings.Contains(sc.Text(), w) {
					continue lines
				}
			}
			return sc.Text()
		}
		select {
		case err := <-d.done:
			d.done <- err
			d.t.Fatalf("rtarget serve exited (%v) before logging %q\n%s", err, want, d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("rtarget serve has not logged %q after 30s\n%s", want, d.log.String())
		}
	}
}

// logValue returns the value of key in a text log line.
func logValue(line, key string) string {
	_, v, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// stop sends sig and returns the exit status (the test fails past
// timeout, and the daemon is killed).
func (d *daemon) stop(sig syscall.Signal, timeout time.Duration) int {
	d.t.Helper()
	d.cmd.Process.Signal(sig)
	select {
	case err := <-d.done:
		d.done <- err
		return exitStatus(err)
	case <-time.After(timeout):
		d.t.Errorf("rtarget serve still runs %s after %s", timeout, sig)
		d.cmd.Process.Kill()
		err := <-d.done
		d.done <- err
		return exitStatus(err)
	}
}
