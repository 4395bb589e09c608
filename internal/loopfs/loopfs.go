// Package loopfs gives tests a small file system of their own: an ext4 or
// XFS file system in a file, mounted through a loop device, so that a test
// can fill it, or run on a file system other than the machine's, without
// touching the machine's.
package loopfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Ext4 mounts a new ext4 file system of size bytes and returns its mount
// point, unmounted when the test ends. It keeps no blocks for root (mkfs
// -m 0): tests run as root, and a full file system is then full for every
// process, as statfs's available count says. It skips the test where that cannot
// be done: not root, or no mkfs.ext4 (make deps installs e2fsprogs).
func Ext4(t testing.TB, size int64) string {
	t.Helper()
	return Ext4FS(t, size).Dir
}

// Ext4FS is Ext4 for a test that also cuts the power of the file system
// (FS.PowerCut).
func Ext4FS(t testing.TB, size int64) *FS {
	t.Helper()
	return mount(t, size, "mkfs.ext4", "-q", "-F", "-m", "0")
}

// FS is a mounted loop file system.
type FS struct {
	Dir string // the mount point
	img string
	cut atomic.Bool // PowerCut and no Remount since
}

// PowerCut stops the file system as a power failure would, with the
// FS_IOC_SHUTDOWN ioctl (what xfstests' godown does) and
// FS_SHUTDOWN_FLAGS_NOLOGFLUSH: neither dirty data nor the journal's last
// transactions reach the device, and from then on every read, write and
// sync of the file system fails with EIO. What a program had made durable
// (fsync, fdatasync, O_SYNC) is on the device; anything else may be lost.
// The programs using the file system must be stopped before Remount.
func (f *FS) PowerCut() error {
	fd, err := unix.Open(f.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("power cut of %s: %w", f.Dir, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetPointerInt(fd, fsIOCShutdown, fsShutdownNoLogFlush); err != nil {
		return fmt.Errorf("power cut of %s: FS_IOC_SHUTDOWN: %w", f.Dir, err)
	}
	f.cut.Store(true)
	return nil
}

// The shutdown ioctl of linux/fs.h (_IOR('X', 125, __u32), EXT4_IOC_SHUTDOWN
// and XFS_IOC_GOINGDOWN before it was generic) and its flag.
const (
	fsIOCShutdown        = 0x8004587d
	fsShutdownNoLogFlush = 2
)

// Remount unmounts the file system and mounts it again, as a machine does
// after a power failure: the mount replays the journal.
func (f *FS) Remount() error {
	if out, err := exec.Command("umount", f.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %w\n%s", f.Dir, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", f.img, f.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount %s: %w\n%s", f.img, err, out)
	}
	f.cut.Store(false)
	return nil
}

// ErrorReadOnly makes an ext4 file system read-only as an error found on
// it would where it is mounted errors=remount-ro: it remounts it with
// that option and raises a test error (the ext4 sysfs trigger_fs_error).
// The journal is aborted and every later write or open for writing fails
// with EROFS. Like PowerCut, it needs a Remount before more use. Where the
// kernel has no such trigger, the error wraps fs.ErrNotExist.
func (f *FS) ErrorReadOnly() error {
	if out, err := exec.Command("mount", "-o", "remount,errors=remount-ro", f.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("remount %s errors=remount-ro: %w\n%s", f.Dir, err, out)
	}
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", f.Dir).Output()
	if err != nil {
		return fmt.Errorf("findmnt %s: %w", f.Dir, err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(out))), "trigger_fs_error")
	if _, err := os.Stat(trigger); err != nil {
		return fmt.Errorf("error on %s: %w", f.Dir, err)
	}
	if err := os.WriteFile(trigger, []byte("loopfs: ErrorReadOnly\n"), 0); err != nil {
		return fmt.Errorf("error on %s: %w", f.Dir, err)
	}
	f.cut.Store(true)
	return nil
}

// XFS is Ext4 for an XFS file system (at least 300 MiB: mkfs.xfs makes no
// smaller one; make deps installs xfsprogs). It also skips the test on a
// kernel without XFS.
func XFS(t testing.TB, size int64) string {
	t.Helper()
	return XFSFS(t, size).Dir
}

// XFSFS is XFS for a test that also cuts the power of the file system.
func XFSFS(t testing.TB, size int64) *FS {
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
func mount(t testing.TB, size int64, mkfs ...string) *FS {
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
	fs := &FS{Dir: mnt, img: img}
	t.Cleanup(func() {
		out, err := exec.Command("umount", mnt).CombinedOutput()
		if err != nil && fs.cut.Load() {
			// The test's process may hold files of the dead file
			// system still (what a test of it leaves, as a crash
			// would): detach it now, the kernel unmounts it when they
			// close, at the latest at the process's exit.
			out, err = exec.Command("umount", "--lazy", mnt).CombinedOutput()
		}
		if err != nil {
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return fs
}
