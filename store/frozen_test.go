package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/internal/loopfs"
)

// frozenFSVolume returns the mount point of a new ext4 file system and a
// 16 MiB thin volume of a store on it; it skips the test without
// fsfreeze.
func frozenFSVolume(t *testing.T) (string, Volume) {
	t.Helper()
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
	return mnt, v
}

// freeze freezes the file system at mnt until thaw, or for 15 s at most.
// It is thawed from another process, whatever becomes of this one: a
// process whose Go world is stopped runs no goroutine to thaw it. The
// cleanup (before the store closes and the file system is unmounted) thaws
// it too when the test ends first; a thaw of a thawed file system fails,
// harmlessly.
func freeze(t *testing.T, mnt string) {
	t.Helper()
	if out, err := exec.Command("fsfreeze", "-f", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze -f: %v: %s", err, out)
	}
	thawer := exec.Command("sh", "-c", "sleep 15; fsfreeze -u "+mnt)
	if err := thawer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("fsfreeze", "-u", mnt).Run()
		thawer.Process.Kill()
		thawer.Wait()
	})
}

func thaw(t *testing.T, mnt string) {
	t.Helper()
	if out, err := exec.Command("fsfreeze", "-u", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze -u: %v: %s", err, out)
	}
}

// TestWriteOnFrozenFSLeavesTheProcessRunning: a data-file write that
// waits in the kernel, its file system frozen (fsfreeze, as backup tools
// and VM snapshot agents do), keeps no P: a garbage collection, which
// stops every P of the process, finishes meanwhile. A write made without
// telling the Go scheduler (syscall.RawSyscall) keeps its P through the
// wait, so the next collection, and every goroutine with it, would wait
// for the thaw: rtarget stopped answering signals, health checks and
// reads. Data-file writes are therefore always scheduler-visible.
func TestWriteOnFrozenFSLeavesTheProcessRunning(t *testing.T) {
	mnt, v := frozenFSVolume(t)
	ctx := context.Background()
	buf := bytes.Repeat([]byte{7}, BlockSize)
	if err := v.WriteBlocks(ctx, 0, buf, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	freeze(t, mnt)
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
	thaw(t, mnt)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestReadOnFrozenFSReturns: reads are served while the store's file
// system is frozen. Those of cached data go without the Go scheduler
// (pread.go), so they must not wait there: preadv2 with RWF_NOWAIT
// returns at once where it would wait, and a read's access-time update
// only tries to take the frozen file system's write lock. Reads of data
// the page cache dropped go to the device, which a freeze does not stop;
// the read that must not block (TryReadBlocks) leaves those to ReadBlocks.
func TestReadOnFrozenFSReturns(t *testing.T) {
	mnt, v := frozenFSVolume(t)
	ctx := context.Background()
	const mib = 1 << 20
	small := bytes.Repeat([]byte{7}, BlockSize)
	large := make([]byte, mib) // at 1 MiB: past the raw reads' bound
	for i := range large {
		large[i] = byte(i/BlockSize + 1)
	}
	if err := v.WriteBlocks(ctx, 0, small, false); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteBlocks(ctx, mib/BlockSize, large, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The data files' pages leave the page cache (clean after the flush,
	// so the advice drops them), then the first block is read back into
	// it: the second MiB's reads go to the device.
	files, err := filepath.Glob(filepath.Join(mnt, "store", "data", "*.data"))
	if err != nil || len(files) == 0 {
		t.Fatalf("data files: %v %v", files, err)
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			t.Fatalf("fadvise %s: %v", name, err)
		}
	}
	if err := v.ReadBlocks(ctx, 0, make([]byte, BlockSize)); err != nil {
		t.Fatal(err)
	}

	freeze(t, mnt)

	// Each read runs in a goroutine and must end well before the thaw.
	within := func(what string, fn func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s on the frozen file system: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s on the frozen file system still waits after 5 s", what)
		}
	}
	got := make([]byte, BlockSize)
	within("TryReadBlocks of cached data", func() error {
		if !v.TryReadBlocks(0, got) {
			return errors.New("TryReadBlocks declined a cached block")
		}
		if !bytes.Equal(got, small) {
			return errors.New("TryReadBlocks read the wrong data")
		}
		return nil
	})
	within("ReadBlocks of cached data", func() error {
		clear(got)
		if err := v.ReadBlocks(ctx, 0, got); err != nil {
			return err
		}
		if !bytes.Equal(got, small) {
			return errors.New("ReadBlocks read the wrong data")
		}
		return nil
	})
	within("TryReadBlocks of data on the device", func() error {
		if v.TryReadBlocks(mib/BlockSize, got) && !bytes.Equal(got, large[:BlockSize]) {
			return errors.New("TryReadBlocks read the wrong data")
		}
		return nil
	})
	within("ReadBlocks of 1 MiB on the device", func() error {
		back := make([]byte, mib)
		if err := v.ReadBlocks(ctx, mib/BlockSize, back); err != nil {
			return err
		}
		if !bytes.Equal(back, large) {
			return errors.New("ReadBlocks read the wrong data")
		}
		return nil
	})
	within("ReadBlocks of a hole", func() error {
		hole := bytes.Repeat([]byte{0xff}, mib)
		if err := v.ReadBlocks(ctx, 2*mib/BlockSize, hole); err != nil {
			return err
		}
		if !bytes.Equal(hole, make([]byte, mib)) {
			return errors.New("a hole read as something else than zeros")
		}
		return nil
	})
	start := time.Now()
	runtime.GC()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a garbage collection took %v on the frozen file system", took)
	}
	// The file system was frozen all along: a write waits for the thaw.
	wrote := make(chan error, 1)
	go func() { wrote <- v.WriteBlocks(ctx, 0, small, false) }()
	select {
	case err := <-wrote:
		t.Fatalf("a write returned (%v) while the file system was frozen", err)
	case <-time.After(200 * time.Millisecond):
	}
	thaw(t, mnt)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}
