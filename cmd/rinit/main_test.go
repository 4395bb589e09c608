package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
)

// TestFlagsHaveEnvVars: every flag of every rinit command can also be set by
// a RINIT_* environment variable.
func TestFlagsHaveEnvVars(t *testing.T) {
	for _, bad := range clix.CheckEnvVars(newApp(), "RINIT_") {
		t.Error(bad)
	}
}

// TestListenUnix: --listen unix:PATH replaces only a stale socket; it
// refuses an empty path, a file that is not a socket and a socket in use.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	if _, err := listen("unix:"); err == nil || !strings.Contains(err.Error(), "empty socket path") {
		t.Errorf("unix: with no path: %v", err)
	}

	regular := filepath.Join(dir, "data")
	if err := os.WriteFile(regular, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := listen("unix:" + regular); err == nil || !strings.Contains(err.Error(), "regular file") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("regular file: %v", err)
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}
	if _, err := listen("unix:" + dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("directory: %v", err)
	}

	// A socket left behind by a process that died.
	sock := filepath.Join(dir, "nbd.sock")
	old, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false)
	old.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("no stale socket to test with: %v", err)
	}
	ln, err := listen("unix:" + sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer ln.Close()

	// A socket in use stays.
	if ln2, err := listen("unix:" + sock); err == nil || !strings.Contains(err.Error(), "in use") {
		if ln2 != nil {
			ln2.Close()
		}
		t.Errorf("socket in use: %v", err)
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("the listener in use lost its socket: %v", err)
	}
	c.Close()
}

// TestLockFlags: the lock commands name exactly one of a lock, the
// exclusive and the shared reservation, and a negative lock number is
// refused as such; all before any connection (the target address is one
// nothing listens on).
func TestLockFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"acquire"}, "give exactly one of --lock N, --exclusive, --shared"},
		{[]string{"acquire", "--lock", "1", "--exclusive"}, "give exactly one of"},
		{[]string{"release", "--shared", "--exclusive"}, "give exactly one of"},
		{[]string{"acquire", "--lock", "-1"}, "--lock -1: locks are numbered from 0"},
		{[]string{"status", "--lock", "-3"}, "--lock -3: locks are numbered from 0"},
	} {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		app.ExitErrHandler = func(*cli.Context, error) {}
		args := append([]string{"rinit", "lock"}, c.args...)
		args = append(args, "--target", "127.0.0.1:1", "--volume", "v", "--timeout", "1s")
		err := app.Run(args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// TestSessionFlagsRefuseNonPositive: --qps and --queue-depth below 1 are
// refused as such before any connection, not replaced by the defaults
// (the target address is one nothing listens on).
func TestSessionFlagsRefuseNonPositive(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--qps", "0"}, "--qps 0"},
		{[]string{"--qps", "-1"}, "--qps -1"},
		{[]string{"--queue-depth", "0"}, "--queue-depth 0"},
		{[]string{"--queue-depth", "-3"}, "--queue-depth -3"},
	} {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		app.ExitErrHandler = func(*cli.Context, error) {}
		args := append([]string{"rinit", "info", "--target", "127.0.0.1:1", "--volume", "v", "--timeout", "1s"}, c.args...)
		err := app.Run(args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
