package e2e

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/loopfs"
)

// TestPowerLoss is TestCrashConsistency with a power cut in place of the
// kill: a thin volume on ext4 and on XFS (the store writes differently
// there: whole requests, and its space is allocated ahead), and a raw
// volume (an image file) on ext4. rtarget's store is on a
// file system of its own, which at a random moment is shut down as a
// power failure would stop it (loopfs.FS.PowerCut: the page cache and the
// journal's open transactions never reach the device, every later I/O
// fails); then rtarget is killed, the file system mounted again (its
// journal replayed) and rtarget started on it. A kill alone leaves what
// rtarget wrote and did not sync to the kernel, which writes it back; here
// only what rtarget made durable (fdatasync of the data files, the
// metadata's syncs) is there after the restart, so every flushed and FUA
// write, snapshot and clone the test counts as durable checks the store's
// syncs and their order. Flushes that fail while the file system is down
// make nothing durable and are counted apart. RNIC_CRASH_CYCLES and
// RNIC_CRASH_SEED as for TestCrashConsistency.
func TestPowerLoss(t *testing.T) {
	for _, c := range []struct {
		name  string
		mount func(testing.TB, int64) *loopfs.FS
		raw   bool
	}{{"ext4", loopfs.Ext4FS, false}, {"xfs", loopfs.XFSFS, false}, {"ext4-raw", loopfs.Ext4FS, true}} {
		t.Run(c.name, func(t *testing.T) {
			fs := c.mount(t, 1<<30)
			crashCycles(t, filepath.Join(fs.Dir, "data"), crashKind{what: "power cut", cutFlushes: true, raw: c.raw,
				down: func(t *testing.T, target *proc) {
					if err := fs.PowerCut(); err != nil {
						t.Fatal(err)
					}
					// rtarget may be exiting on the errors already; it must
					// not have exited cleanly.
					if err := target.stop(syscall.SIGKILL, 10*time.Second); err == nil {
						t.Fatalf("rtarget exited cleanly after the power cut:\n%s", target.output())
					}
					if err := fs.Remount(); err != nil {
						t.Fatal(err)
					}
				}})
		})
	}
}
