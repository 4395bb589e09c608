package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/loopfs"
)

// TestFullFileSystem serves a 512 MiB thin volume from a store on a
// 160 MiB file system and writes past what it holds. The NBD client gets
// ENOSPC; rtarget stays up (badger's memory-mapped log used to find no
// free block at the next commit and kill it with SIGBUS), says that its
// file system is full, and goes on: flushes, reads of what was
// written, overwrites of it, and a snapshot through its control socket.
func TestFullFileSystem(t *testing.T) {
	needTools(t, "qemu-io")
	data := filepath.Join(loopfs.Ext4(t, 160<<20), "data")
	s := newStack(t, data)
	rt, _ := bins(t)
	qemuIO := func(cmds ...string) (string, error) {
		args := []string{"-f", "raw", s.uri()}
		for _, c := range cmds {
			args = append(args, "-c", c)
		}
		out, err := exec.Command("qemu-io", args...).CombinedOutput()
		return string(out), err
	}
	if out, err := qemuIO("write -P 0x5a 0 16M"); err != nil || strings.Contains(out, "failed") {
		t.Fatalf("first 16 MiB: %v\n%s", err, out)
	}
	out, _ := qemuIO("write -P 0x6b 16M 400M", "flush")
	if !strings.Contains(out, "write failed: No space left on device") {
		t.Fatalf("write past what the file system holds:\n%s", out)
	}
	if strings.Contains(out, "flush failed") {
		t.Fatalf("flush after the failed write:\n%s", out)
	}
	select {
	case err := <-s.target.done:
		s.target.done <- err
		t.Fatalf("rtarget exited on a full file system: %v", err)
	default:
	}
	out, err := qemuIO("read -P 0x5a 0 16M", "write -P 0x77 0 1M", "flush", "read -P 0x77 0 1M", "read -P 0x5a 1M 15M")
	if err != nil || strings.Contains(out, "failed") || strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("reads and an overwrite on a full file system: %v\n%s", err, out)
	}
	if out := run(t, time.Minute, rt, "volume", "snapshot", "--data", data, "vol", "s1"); !strings.Contains(out, "created snapshot") {
		t.Fatalf("snapshot: %s", out)
	}
	if log := s.target.output(); !strings.Contains(log, "the file system of the store is full") ||
		strings.Contains(log, "SIGBUS") {
		t.Fatalf("rtarget's log:\n%s", log)
	}
}
