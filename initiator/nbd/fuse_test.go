package nbd

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuseDisk is the export seen as a block device: nbdfuse exposes it as a
// file in a FUSE mount, losetup turns the file into /dev/loopN.
type fuseDisk struct {
	t       *testing.T
	dir     string
	loop    string
	fuse    *exec.Cmd
	done    chan error
	out     bytes.Buffer
	mnt     string // mounted file system, if any
	cleaned bool
}

// attachFuse starts nbdfuse on uri and a loop device on its file. Detach
// runs at the end of the test whatever happens.
func attachFuse(t *testing.T, uri, dir string) *fuseDisk {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &fuseDisk{t: t, dir: dir, done: make(chan error, 1)}
	pidfile := filepath.Join(dir, "..", filepath.Base(dir)+".pid")
	_ = os.Remove(pidfile)
	// nbdfuse stays in the foreground until unmounted.
	d.fuse = exec.Command("nbdfuse", "-P", pidfile, filepath.Join(dir, "disk"), uri)
	d.fuse.Stdout, d.fuse.Stderr = &d.out, &d.out
	if err := d.fuse.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.fuse.Wait() }()
	t.Cleanup(d.detach)

	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(pidfile); err == nil {
			break
		}
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("nbdfuse exited: %v\n%s", err, d.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdfuse not ready after 15s\n%s", d.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.loop = strings.TrimSpace(run(t, 30*time.Second, "losetup", "--find", "--show", filepath.Join(dir, "disk")))
	return d
}

func (d *fuseDisk) mount(mnt string) {
	run(d.t, 30*time.Second, "mount", "-t", "ext4", d.loop, mnt)
	d.mnt = mnt
}

func (d *fuseDisk) umount() {
	run(d.t, 60*time.Second, "umount", d.mnt)
	d.mnt = ""
}

// detach unmounts, frees the loop device and unmounts the FUSE file
// system; it is safe to call twice, and logs instead of failing so that
// it can run as a cleanup.
func (d *fuseDisk) detach() {
	if d.cleaned {
		return
	}
	d.cleaned = true
	if d.mnt != "" {
		if out, err := runErr(60*time.Second, "umount", d.mnt); err != nil {
			d.t.Errorf("umount %s: %v %s", d.mnt, err, out)
			_, _ = runErr(60*time.Second, "umount", "-l", d.mnt)
		}
	}
	if d.loop != "" {
		if out, err := runErr(30*time.Second, "losetup", "-d", d.loop); err != nil {
			d.t.Errorf("losetup -d %s: %v %s", d.loop, err, out)
		}
	}
	if out, err := runErr(30*time.Second, "fusermount3", "-u", d.dir); err != nil {
		d.t.Errorf("fusermount3 -u %s: %v %s", d.dir, err, out)
		_ = d.fuse.Process.Kill()
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		d.t.Errorf("nbdfuse still running 15s after unmount; killing it")
		_ = d.fuse.Process.Kill()
		<-d.done
	}
}

// TestNbdfuseExt4 puts an ext4 file system on the export through nbdfuse
// and a loop device and writes a file; then tears the whole stack down and
// builds it again, so that the second mount, the read back and e2fsck see
// only what reached the NBD server.
func TestNbdfuseExt4(t *testing.T) {
	needTools(t, "nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	if os.Geteuid() != 0 {
		t.Skip("needs root for losetup and mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	m := newMem(128 << 20)
	s := serve(t, &Server{Exports: []Export{{Name: "vol", Backend: m, MultiConn: true}}})
	uri := nbdURI(s, "vol")
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}

	content := make([]byte, 8<<20)
	_, _ = rand.NewChaCha8([32]byte{42}).Read(content)
	sum := sha256.Sum256(content)

	d := attachFuse(t, uri, filepath.Join(dir, "fuse1"))
	if fi, err := os.Stat(filepath.Join(d.dir, "disk")); err != nil || fi.Size() != 128<<20 {
		t.Fatalf("FUSE file: %v %v", err, fi)
	}
	t.Logf("nbdfuse file -> %s", d.loop)
	run(t, 60*time.Second, "mkfs.ext4", "-q", "-F", d.loop)
	d.mount(mnt)
	if err := os.WriteFile(filepath.Join(mnt, "data.bin"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	d.umount()
	d.detach()
	writes, flushes := m.writes.Load(), m.flushes.Load()
	if writes == 0 || flushes == 0 {
		t.Fatalf("after the first mount: %d writes, %d flushes reached the backend", writes, flushes)
	}

	reads := m.reads.Load()
	d = attachFuse(t, uri, filepath.Join(dir, "fuse2"))
	d.mount(mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "data.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sum {
		t.Fatal("file read back through a fresh nbdfuse/loop/mount differs")
	}
	d.umount()
	if n := m.reads.Load() - reads; n*(128<<10) < int64(len(content)) {
		t.Errorf("only %d reads reached the backend for an %d byte file", n, len(content))
	}
	out := run(t, 60*time.Second, "e2fsck", "-fn", d.loop)
	t.Logf("e2fsck -fn:\n%s", out)
	d.detach()
	t.Logf("backend: reads %d writes %d (FUA %d) flushes %d trims %d zeroes %d",
		m.reads.Load(), m.writes.Load(), m.fuaWrites.Load(), m.flushes.Load(), m.trims.Load(), m.zeroes.Load())
}
