package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/loopfs"
)

// TestPowerLoss is TestCrashConsistency with a power cut in place of the
// kill: a thin volume on ext4 and on XFS (the store writes differently
// there: whole requests, and its space is allocated ahead), and a raw
// volume (an image file) on ext4. rtarget's store is on a file system of
// its own, which at a random moment is shut down as a power failure would
// stop it (loopfs.FS.PowerCut: the page cache and the journal's open
// transactions never reach the device, every later I/O fails); then
// rtarget is killed, or every other time stopped with SIGTERM, as a
// service manager would stop it on a dead disk (it must exit by itself,
// with an error), the file system is mounted again (its journal replayed)
// and rtarget started on it. A kill alone leaves what rtarget wrote and
// did not sync to the kernel, which writes it back; here only what rtarget
// made durable (fdatasync of the data files, the metadata's syncs) is
// there after the restart, so every flushed and FUA write, snapshot and
// clone the test counts as durable checks the store's syncs and their
// order. Flushes that fail while the file system is down make nothing
// durable and are counted apart, and an answer to an operation that
// overlaps the cut counts as not given: a real cut stops the machine at
// once, this one leaves the kernel answering syncs it was already running
// (crashModel.overlapsCut). RNIC_CRASH_CYCLES and RNIC_CRASH_SEED as for
// TestCrashConsistency.
func TestPowerLoss(t *testing.T) {
	for _, c := range []struct {
		name  string
		mount func(testing.TB, int64) *loopfs.FS
		raw   bool
	}{{"ext4", loopfs.Ext4FS, false}, {"xfs", loopfs.XFSFS, false}, {"ext4-raw", loopfs.Ext4FS, true}} {
		t.Run(c.name, func(t *testing.T) {
			fs := c.mount(t, 1<<30)
			downs, faults := 0, 0
			defer func() {
				t.Logf("rtarget died of a SIGBUS in badger's mapped log at %d of %d power cuts", faults, downs)
			}()
			crashCycles(t, filepath.Join(fs.Dir, "data"), crashKind{what: "power cut", powerCut: true, raw: c.raw,
				down: func(t *testing.T, target *proc, healthz string) {
					if err := fs.PowerCut(); err != nil {
						t.Fatal(err)
					}
					if healthzAfterCut(t, target, healthz) {
						faults++
					}
					// stop fails the test if rtarget takes 30 s to exit.
					sig := syscall.SIGKILL
					if downs++; downs%2 == 0 {
						sig = syscall.SIGTERM
					}
					if err := target.stop(sig, 30*time.Second); err == nil {
						t.Fatalf("rtarget exited cleanly after the power cut (%s):\n%s", sig, target.output())
					}
					if err := fs.Remount(); err != nil {
						t.Fatal(err)
					}
				}})
		})
	}
}

// healthzAfterCut checks that rtarget's /healthz answers 503 right after
// a power cut (the store's health probe sees the dead file system, whether
// or not a write failed yet), or that rtarget is dead already of the one
// fault a dead file system can deal it, which it reports: a SIGBUS in
// badger's memtable log. badger writes that log through a shared memory
// mapping, and a write into a page the kernel had written back faults
// once the file system is shut down (page_mkwrite fails); no Go program
// can recover from a fault in another package's goroutine. That is a
// crash, which the next start recovers from like any other.
func healthzAfterCut(t *testing.T, target *proc, url string) (faulted bool) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err == nil {
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/healthz after the power cut: %d %q, want 503", resp.StatusCode, b)
		}
		return false
	}
	select {
	case exit := <-target.done:
		target.done <- exit
		if out := target.output(); !strings.Contains(out, "SIGBUS") || !strings.Contains(out, "badger") {
			t.Fatalf("/healthz after the power cut: %v; rtarget exited (%v), not of a SIGBUS in badger", err, exit)
		}
		return true
	case <-time.After(10 * time.Second):
		t.Fatalf("/healthz after the power cut: %v, and rtarget is still running", err)
	}
	return false
}
