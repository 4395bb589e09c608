// Package loopfs gives tests a small file system of their own: an ext4
// file system in a file, mounted through a loop device, so that a test can
// fill it without touching the machine's.
package loopfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Ext4 mounts a new ext4 file system of size bytes and returns its mount
// point, unmounted when the test ends. It keeps no blocks for root (mkfs
// -m 0): tests run as root, and a full file system is then full for every
// process, as statfs's available count says. It skips the test where that cannot
// be done: not root, or no mkfs.ext4 (make deps installs e2fsprogs).
func Ext4(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop file system")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make deps installs it)", tool)
		}
	}
	work := t.TempDir()
	img, mnt := filepath.Join(work, "fs.img"), filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-F", "-m", "0", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}
