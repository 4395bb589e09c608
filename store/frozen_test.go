package store

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/loopfs"
)

// TestWriteOnFrozenFSLeavesTheProcessRunning: a data-file write that
// waits in the kernel, its file system frozen (fsfreeze, as backup tools
// and VM snapshot agents do), keeps no P: a garbage collection, which
// stops every P of the process, finishes meanwhile. A write made without
// telling the Go scheduler (syscall.RawSyscall) keeps its P through the
// wait, so the next collection, and every goroutine with it, would wait
// for the thaw: rtarget stopped answering signals, health checks and
// reads. Data-file writes are therefore always scheduler-visible.
func TestWriteOnFrozenFSLeavesTheProcessRunning(t *testing.T) {
	mnt := loopfs.Ext4(t, 256<<20)
	if _, err := exec.LookPath("fsfreeze"); err != nil {
		t.Skip("fsfreeze not installed (util-linux)")
	}
	st, err := OpenThin(filepath.Join(mnt, "store"), ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "v", 16<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	buf := bytes.Repeat([]byte{7}, BlockSize)
	if err := v.WriteBlocks(ctx, 0, buf, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("fsfreeze", "-f", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze -f: %v: %s", err, out)
	}
	// Thawed from another process, whatever becomes of this one: a process
	// whose Go world is stopped runs no goroutine to thaw it. The cleanup
	// (before the store closes and the file system is unmounted) thaws it
	// too when the test ends first; a thaw of a thawed file system fails,
	// harmlessly.
	thawer := exec.Command("sh", "-c", "sleep 15; fsfreeze -u "+mnt)
	if err := thawer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("fsfreeze", "-u", mnt).Run()
		thawer.Process.Kill()
		thawer.Wait()
	})
	waiting := func() int {
		t.Helper()
		n, err := loopfs.ThreadsWaiting(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := waiting()
	done := make(chan error, 1)
	go func() { done <- v.WriteBlocks(ctx, 0, buf, false) }() // an overwrite in place
	for deadline := time.Now().Add(10 * time.Second); waiting() <= before; {
		if time.Now().After(deadline) {
			t.Fatal("no thread waits on the frozen file system 10 s after the write")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	runtime.GC()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a garbage collection took %v, waiting for the thaw: the write on the frozen file system held its P", took)
	}
	select {
	case err := <-done:
		t.Fatalf("the write returned (%v) while its file system was frozen", err)
	default:
	}
	if out, err := exec.Command("fsfreeze", "-u", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze -u: %v: %s", err, out)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
