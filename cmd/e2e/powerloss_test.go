package e2e

import (
	"io"
	"net/http"
	"path/filepath"
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
// durable and are counted apart. RNIC_CRASH_CYCLES and RNIC_CRASH_SEED as
// for TestCrashConsistency.
func TestPowerLoss(t *testing.T) {
	for _, c := range []struct {
		name  string
		mount func(testing.TB, int64) *loopfs.FS
		raw   bool
	}{{"ext4", loopfs.Ext4FS, false}, {"xfs", loopfs.XFSFS, false}, {"ext4-raw", loopfs.Ext4FS, true}} {
		t.Run(c.name, func(t *testing.T) {
			fs := c.mount(t, 1<<30)
			downs := 0
			crashCycles(t, filepath.Join(fs.Dir, "data"), crashKind{what: "power cut", cutFlushes: true, raw: c.raw,
				down: func(t *testing.T, target *proc, healthz string) {
					if err := fs.PowerCut(); err != nil {
						t.Fatal(err)
					}
					// /healthz sees the dead file system at once, whatever
					// failed or not yet.
					if code, body := httpGet(t, healthz); code != http.StatusServiceUnavailable {
						t.Fatalf("/healthz after the power cut: %d %q, want 503", code, body)
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

// httpGet returns the status code and body of a GET of url, which must
// answer within 10 s.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
