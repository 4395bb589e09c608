package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/internal/loopfs"
)

// TestServeRawVolumeGone: a raw volume whose file was deleted takes only
// itself down. rtarget serve starts, logs it as unavailable naming the
// file, and serves the other volumes; /healthz answers 200; volume list
// (through the daemon and on the store directly) lists it with the cause,
// its size unknown; a login to it fails.
func TestServeRawVolumeGone(t *testing.T) {
	dir := t.TempDir()
	data, img := filepath.Join(dir, "data"), filepath.Join(dir, "raw.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--raw", img, "r"}, {"thin", "1M"}} {
		if _, stderr, status := execRtarget(t, append([]string{"volume", "create", "--data", data}, args...)...); status != 0 {
			t.Fatalf("volume create %q: status %d\n%s", args, status, stderr)
		}
	}
	if err := os.Remove(img); err != nil {
		t.Fatal(err)
	}
	list := func(when string) {
		t.Helper()
		stdout, stderr, status := execRtarget(t, "volume", "list", "--data", data, "--json")
		if status != 0 {
			t.Fatalf("%s: volume list --json: status %d\n%s", when, status, stderr)
		}
		var vs []listedVolume
		if err := json.Unmarshal([]byte(stdout), &vs); err != nil {
			t.Fatalf("%s: volume list --json: %v\n%s", when, err, stdout)
		}
		if len(vs) != 2 || vs[0].Name != "r" || vs[1].Name != "thin" || vs[1].Size != 1<<20 || vs[1].Unavailable != "" {
			t.Fatalf("%s: volume list --json: %s", when, stdout)
		}
		if r := vs[0]; !strings.Contains(r.Unavailable, img) || r.Size != 0 || r.RawPath != img {
			t.Errorf("%s: volume r listed as %+v, want it unavailable with the cause naming %s, size 0", when, r, img)
		}
		stdout, stderr, status = execRtarget(t, "volume", "list", "--data", data)
		if status != 0 || !strings.Contains(stdout, "unavailable: ") || !strings.Contains(stdout, "no such file") {
			t.Errorf("%s: volume list: status %d, want r shown unavailable with the cause\n%s%s", when, status, stdout, stderr)
		}
	}
	list("offline")

	d := startServe(t, "--data", data, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	served := d.waitLog("msg=serving")
	d.waitLog("level=WARN", "volume=r", img)
	metrics := logValue(d.waitLog("msg=metrics"), "addr")
	resp, err := http.Get("http://" + metrics + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz with one raw volume's file gone: %d %s, want 200", resp.StatusCode, body)
	}
	list("through the daemon")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := initiator.Config{Addr: logValue(served, "listen"), Initiator: "test", Secret: []byte(clix.InsecureSecret),
		Logger: slog.New(slog.DiscardHandler), NoReconnect: true}
	cfg.Volume = "thin"
	c, err := initiator.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("login to the thin volume beside the unavailable one: %v", err)
	}
	if err := c.ReadAt(ctx, make([]byte, 4096), 0); err != nil {
		t.Errorf("read of the thin volume: %v", err)
	}
	c.Close()
	cfg.Volume = "r"
	if c, err := initiator.Connect(ctx, cfg); err == nil {
		c.Close()
		t.Errorf("login to the raw volume whose file is gone succeeded")
	}
	if status := d.stop(syscall.SIGTERM, 30*time.Second); status != 0 {
		t.Errorf("rtarget serve exited with status %d after SIGTERM, want 0", status)
	}
}

// threadsWaiting counts the threads of process pid in uninterruptible
// sleep (state D), where a write to a frozen file system waits.
func threadsWaiting(t *testing.T, pid int) int {
	t.Helper()
	n, err := loopfs.ThreadsWaiting(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestServeDrainIncompleteExitStatus: SIGTERM while a write cannot finish
// within --drain-timeout (the store's file system frozen under it) ends
// rtarget serve with status 1 once the store is synced, so that systemd
// and scripts can tell the stop from a clean one; the log says why. A
// second SIGTERM meanwhile is logged and ignored, not fatal.
func TestServeDrainIncompleteExitStatus(t *testing.T) {
	mnt := loopfs.Ext4(t, 256<<20)
	if _, err := exec.LookPath("fsfreeze"); err != nil {
		t.Skip("fsfreeze not installed (util-linux)")
	}
	d := startServe(t, "--data", filepath.Join(mnt, "data"), "--volume", "v:16M", "--listen", "127.0.0.1:0",
		"--reserve", "4M", "--drain-timeout", "500ms")
	served := d.waitLog("msg=serving")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, initiator.Config{Addr: logValue(served, "listen"), Volume: "v", Initiator: "test",
		Secret: []byte(clix.InsecureSecret), Logger: slog.New(slog.DiscardHandler), NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	if err := c.WriteAt(ctx, buf, 0, true); err != nil {
		t.Fatal(err)
	}
	freeze := func(how string) error {
		out, err := exec.Command("fsfreeze", how, mnt).CombinedOutput()
		if err != nil {
			return fmt.Errorf("fsfreeze %s: %w: %s", how, err, out)
		}
		return nil
	}
	if err := freeze("-f"); err != nil {
		t.Fatal(err)
	}
	// Thawed before the daemon is killed (cleanups run last first): a
	// process waiting on a frozen file system does not die.
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := freeze("-u"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(thaw)
	before := threadsWaiting(t, d.cmd.Process.Pid)
	go c.WriteAt(ctx, buf, 0, false) // waits in rtarget's write to the frozen file
	for deadline := time.Now().Add(20 * time.Second); threadsWaiting(t, d.cmd.Process.Pid) <= before; {
		if time.Now().After(deadline) {
			t.Fatal("no thread of rtarget serve waits on the frozen file system 20 s after the write")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.waitLog("msg=draining")
	time.Sleep(time.Second) // past --drain-timeout, the write still waiting
	// A second signal while it stops is logged and ignored: the default
	// action would kill it before the store's sync and close.
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.waitLog("level=WARN", `msg="already stopping: signal ignored`, "signal=terminated")
	thaw()
	status := d.stop(syscall.SIGTERM, 60*time.Second)
	d.waitLog("level=ERROR", `msg="drain incomplete"`)
	if status != 1 {
		t.Errorf("rtarget serve exited with status %d after a drain that did not finish, want 1", status)
	}
}
