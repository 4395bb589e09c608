package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// crashDirEnv names the store directory for the child process of
// TestBadgerCrashDurability; when set, TestCrashChild does the writing.
const crashDirEnv = "STORE_CRASH_CHILD_DIR"

// Layout of what the child writes in volume "crash" (4096 blocks).
const (
	crashFlushed   = 0    // 512 blocks at 0, tag 1, then Flush
	crashFUA       = 1000 // 64 blocks at 1000, tag 2, each write FUA
	crashTrimmed   = 100  // 50 blocks at 100 trimmed (WriteZeroes FUA)
	crashUnflushed = 2000 // 256 blocks at 2000, tag 3, never flushed
)

// TestCrashChild is the child process's body; it is skipped unless run by
// TestBadgerCrashDurability. It writes, flushes and SIGKILLs itself, so no
// Close (and no deferred code) runs.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child process of TestBadgerCrashDurability")
	}
	ctx := context.Background()
	s, err := OpenBadger(dir, BadgerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, s, "crash", 4096*BlockSize)
	mustWrite(t, v, crashFlushed, patternBlocks(crashFlushed, 512, 1))
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 64; i += 4 {
		if err := v.WriteBlocks(ctx, crashFUA+i, patternBlocks(crashFUA+i, 4, 2), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.WriteZeroes(ctx, crashTrimmed, 50, true); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, v, crashUnflushed, patternBlocks(crashUnflushed, 256, 3))
	fmt.Println("CHILD-READY")
	os.Stdout.Sync()
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // not reached
}

// TestBadgerCrashDurability runs TestCrashChild in a child process that
// kills itself with SIGKILL after flushing, then reopens the store: flushed
// and FUA data, and the FUA write-zeroes, are there; the directory lock
// died with the process.
//
// A process kill loses no page-cache data, so this checks recovery after a
// crash, not fsync itself (TestBadgerFlushSyncs checks that Flush and FUA
// sync; power loss is not simulated).
func TestBadgerCrashDurability(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("in the child")
	}
	dir := t.TempDir()
	out, err := childCommand("TestCrashChild", crashDirEnv, dir).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v\n%s", err, out)
	}
	if !hasLine(string(out), "CHILD-READY") {
		t.Fatalf("child died before finishing its writes:\n%s", out)
	}

	s := openBadger(t, dir, BadgerOptions{})
	defer s.Close()
	v, err := s.OpenVolume(context.Background(), "crash")
	if err != nil {
		t.Fatalf("volume lost in the crash: %v", err)
	}
	defer v.Close()
	want := patternBlocks(crashFlushed, 512, 1)
	clear(want[crashTrimmed*BlockSize : (crashTrimmed+50)*BlockSize])
	equalBlocks(t, "flushed data", crashFlushed, mustRead(t, v, crashFlushed, 512), want)
	equalBlocks(t, "FUA data", crashFUA, mustRead(t, v, crashFUA, 64), patternBlocks(crashFUA, 64, 2))
	// Unflushed writes may or may not have survived, but each block is
	// either the data written or zeros, never anything else.
	got := mustRead(t, v, crashUnflushed, 256)
	survived := 0
	for i := range uint64(256) {
		tag, ok := blockTag(got[i*BlockSize:(i+1)*BlockSize], crashUnflushed+i)
		if !ok || (tag != 0 && tag != 3) {
			t.Fatalf("unflushed block %d holds foreign data", crashUnflushed+i)
		}
		if tag == 3 {
			survived++
		}
	}
	if survived != 0 && survived != 256 {
		t.Fatalf("%d of 256 blocks of one unflushed write survived: not atomic", survived)
	}
	t.Logf("unflushed 1 MiB write survived the kill: %v", survived == 256)
}

func hasLine(out, line string) bool {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == line {
			return true
		}
	}
	return false
}
