// Package loopfs gives tests a small file system of their own: an ext4 or
// XFS file system in a file, mounted through a loop device, so that a test
// can fill it, or run on a file system other than the machine's, without
// touching the machine's.
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
	return mount(t, size, "mkfs.ext4", "-q", "-F", "-m", "0")
}

// XFS is Ext4 for an XFS file system (at least 300 MiB: mkfs.xfs makes no
// smaller one; make deps installs xfsprogs). It also skips the test on a
// kernel without XFS.
func XFS(t testing.TB, size int64) string {
	t.Helper()
	if !kernelHas("xfs") {
		exec.Command("modprobe", "xfs").Run() // absent or built in: kernelHas says
		if !kernelHas("xfs") {
			t.Skip("this kernel has no XFS (not in /proc/filesystems, and modprobe xfs failed)")
		}
	}
	return mount(t, size, "mkfs.xfs", "-q", "-f")
}

// kernelHas reports whether the running kernel lists file system fs in
// /proc/filesystems.
func kernelHas(fs string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// mount makes a file system of size bytes in a file with mkfs (its
// arguments before the image's path) and mounts it.
func mount(t testing.TB, size int64, mkfs ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop file system")
	}
	for _, tool := range []string{mkfs[0], "mount", "umount"} {
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
	for _, cmd := range [][]string{append(mkfs[:len(mkfs):len(mkfs)], img), {"mount", "-o", "loop", img, mnt}} {
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
