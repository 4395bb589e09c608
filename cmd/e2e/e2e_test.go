// Package e2e runs the built rtarget and rinit binaries as real processes
// and drives them with real NBD clients from Debian packages (nbdinfo,
// nbdcopy, qemu-io, fio, nbdfuse) and the kernel's loop device and ext4.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/childproc"
	"github.com/rnic-dev/rnic/internal/gobuild"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// bins builds rtarget and rinit once per test process.
func bins(t *testing.T) (rtarget, rinit string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "rnic-e2e-bin")
		if buildErr != nil {
			return
		}
		out, err := gobuild.Build(nil, "-o", binDir, "github.com/rnic-dev/rnic/cmd/rtarget", "github.com/rnic-dev/rnic/cmd/rinit")
		if err != nil {
			buildErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "rtarget"), filepath.Join(binDir, "rinit")
}

// removeBins removes the directory bins built into (with rtarget-ceph, in
// the ceph build): each test process builds anew, and the directory
// outlives every test, so TestMain removes it after the run.
func removeBins() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

func needTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not installed (make deps installs it)", n)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a running binary with its combined output captured.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	childproc.DieWithParent(p.cmd, syscall.SIGTERM)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 30*time.Second)
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.output())
		}
	})
	return p
}

// stop signals the process and waits for it; it returns its exit error.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	select {
	case err := <-p.done: // already exited (ProcessState is Wait's to write)
		p.done <- err
		return err
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		p.t.Errorf("%s did not stop within %s after %s", p.cmd.Path, timeout, sig)
		return err
	}
}

// waitPort waits until addr accepts connections.
func waitPort(t *testing.T, addr string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		p.failIfExited(t)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not listening after 20s\n%s", addr, p.output())
}

// failIfExited fails t if p has exited.
func (p *proc) failIfExited(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("%s exited: %v\n%s", p.cmd.Path, err, p.output())
	default:
	}
}

// waitOutput waits (up to 30 s) until p has printed want, a log message:
// for rinit nbd, "serving NBD" means its session is up, which a listening
// port does not (rinit listens before it connects to the target).
func waitOutput(t *testing.T, p *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.output(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s has not printed %q after 30s\n%s", p.cmd.Path, want, p.output())
		}
		p.failIfExited(t)
		time.Sleep(20 * time.Millisecond)
	}
}

// stack is rtarget + rinit nbd on loopback.
type stack struct {
	t              *testing.T
	data           string
	targetAddr     string
	nbdAddr        string
	metricsAddr    string
	target, rinit_ *proc
}

func (s *stack) uri() string { return "nbd://" + s.nbdAddr + "/vol" }

func newStack(t *testing.T, data string, extra ...string) *stack {
	t.Helper()
	rt, ri := bins(t)
	s := &stack{t: t, data: data, targetAddr: freePort(t), nbdAddr: freePort(t), metricsAddr: freePort(t)}
	args := append([]string{"serve", "--data", data, "--listen", s.targetAddr, "--volume", "vol:512M",
		"--metrics-listen", s.metricsAddr}, extra...)
	s.target = start(t, rt, args...)
	waitPort(t, s.targetAddr, s.target)
	s.rinit_ = start(t, ri, "nbd", "--target", s.targetAddr, "--volume", "vol", "--listen", s.nbdAddr, "--name", "e2e")
	waitPort(t, s.nbdAddr, s.rinit_)
	return s
}

// metric returns the value of the rtarget metric line starting with name.
func (s *stack) metric(t *testing.T, name string) int {
	t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+" "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("metric %s: %q", name, l)
			}
			return n
		}
	}
	t.Fatalf("no metric %s in:\n%s", name, b)
	return 0
}

func run(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randomFile(t *testing.T, path string, size int) [32]byte {
	t.Helper()
	r := rand.NewChaCha8([32]byte{7})
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if _, err := io.CopyN(w, r, int64(size)); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func fileSum(t *testing.T, path string, n int64) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestNBDClients runs every user-space NBD client against rinit -> rtarget
// with the thin store on disk.
func TestNBDClients(t *testing.T) {
	needTools(t, "nbdinfo", "nbdcopy", "qemu-io", "fio")
	s := newStack(t, t.TempDir())

	t.Run("nbdinfo", func(t *testing.T) {
		var info struct {
			Exports []map[string]any `json:"exports"`
		}
		if err := json.Unmarshal([]byte(run(t, 30*time.Second, "nbdinfo", "--json", s.uri())), &info); err != nil {
			t.Fatal(err)
		}
		e := info.Exports[0]
		t.Logf("nbdinfo: size=%v flush=%v fua=%v trim=%v zero=%v multi_conn=%v min=%v pref=%v",
			e["export-size"], e["can_flush"], e["can_fua"], e["can_trim"], e["can_zero"], e["can_multi_conn"],
			e["block_size_minimum"], e["block_size_preferred"])
		if e["export-size"] != float64(512<<20) {
			t.Errorf("size %v", e["export-size"])
		}
		for _, k := range []string{"can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn"} {
			if e[k] != true {
				t.Errorf("%s = %v", k, e[k])
			}
		}
		if e["block_size_minimum"] != float64(512) || e["block_size_preferred"] != float64(4096) {
			t.Errorf("block sizes %v / %v", e["block_size_minimum"], e["block_size_preferred"])
		}
	})

	t.Run("nbdcopy-256M", func(t *testing.T) {
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
		want := randomFile(t, in, 256<<20)
		t0 := time.Now()
		run(t, 5*time.Minute, "nbdcopy", "--flush", in, s.uri())
		t1 := time.Now()
		run(t, 5*time.Minute, "nbdcopy", s.uri(), out)
		t.Logf("nbdcopy 256 MiB in %s (%.0f MB/s), out %s", t1.Sub(t0).Round(time.Millisecond),
			256*1.048576/t1.Sub(t0).Seconds(), time.Since(t1).Round(time.Millisecond))
		if got := fileSum(t, out, 256<<20); got != want {
			t.Fatalf("image read back differs: %x != %x", got, want)
		}
	})

	t.Run("qemu-io", func(t *testing.T) {
		out := run(t, time.Minute, "qemu-io", "-f", "raw", s.uri(),
			"-c", "write -P 0xab 300M 1M", "-c", "read -P 0xab 300M 1M",
			"-c", "writev -P 0xcd 310M 4k 8k 512", "-c", "readv -P 0xcd 310M 4k 8k 512",
			"-c", "aio_write -P 0x11 320M 64k", "-c", "aio_flush", "-c", "read -P 0x11 320M 64k",
			"-c", "write -f -P 0x22 330M 4k", "-c", "read -P 0x22 330M 4k",
			"-c", "discard 300M 1M", "-c", "read -P 0 300M 1M",
			"-c", "write -z 310M 64k", "-c", "read -P 0 310M 64k", "-c", "flush")
		if strings.Contains(out, "failed") || strings.Count(out, "read ") != 6 || strings.Count(out, "wrote ") != 5 {
			t.Fatalf("qemu-io:\n%s", out)
		}
	})

	t.Run("fio-verify", func(t *testing.T) {
		out := run(t, 5*time.Minute, "fio", "--name=verify", "--ioengine=nbd", "--uri="+s.uri(), "--rw=randrw",
			"--bs=4k", "--iodepth=32", "--size=128M", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0",
			"--output-format=json")
		if i := strings.IndexByte(out, '{'); i > 0 {
			out = out[i:]
		}
		var r struct {
			Jobs []struct {
				Error int `json:"error"`
				Read  struct {
					IOPS    float64 `json:"iops"`
					IOBytes int64   `json:"io_bytes"`
				} `json:"read"`
				Write struct {
					IOPS    float64 `json:"iops"`
					IOBytes int64   `json:"io_bytes"`
				} `json:"write"`
			} `json:"jobs"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("fio output: %v\n%s", err, out)
		}
		j := r.Jobs[0]
		t.Logf("fio randrw 4k QD32 verify=crc32c: error=%d read %.0f IOPS (%d MiB), write %.0f IOPS (%d MiB)",
			j.Error, j.Read.IOPS, j.Read.IOBytes>>20, j.Write.IOPS, j.Write.IOBytes>>20)
		if j.Error != 0 || j.Read.IOBytes == 0 || j.Write.IOBytes == 0 {
			t.Fatalf("fio job: %+v", j)
		}
	})

	// NBD FLUSH and FUA reach the thin store's sync: every NBD flush
	// is a store sync (qemu-io flushes when it closes the export, even
	// with cache=unsafe, which only stops it asking for more), and a FUA
	// write is one more; a plain write is none.
	t.Run("flush-fua-reach-sync", func(t *testing.T) {
		step := func(what string, args ...string) (syncs, flushes int) {
			s0, f0 := s.metric(t, "rtarget_store_syncs_total"), s.metric(t, `rtarget_ops_total{op="flush"}`)
			run(t, time.Minute, "qemu-io", append([]string{"-f", "raw", s.uri()}, args...)...)
			syncs, flushes = s.metric(t, "rtarget_store_syncs_total")-s0, s.metric(t, `rtarget_ops_total{op="flush"}`)-f0
			t.Logf("%s: %d NBD flushes, %d store syncs", what, flushes, syncs)
			return syncs, flushes
		}
		if sy, fl := step("plain write", "--cache=unsafe", "-c", "write -P 0x31 340M 64k"); sy != fl {
			t.Errorf("plain write: %d store syncs for %d flushes", sy, fl)
		}
		if sy, fl := step("FUA write", "--cache=unsafe", "-c", "write -f -P 0x32 340M 64k"); sy != fl+1 {
			t.Errorf("FUA write: %d store syncs for %d flushes, want one more", sy, fl)
		}
		if sy, fl := step("write+flush", "--cache=writeback", "-c", "write -P 0x33 340M 64k", "-c", "flush"); fl < 2 || sy != fl {
			t.Errorf("explicit flush: %d store syncs for %d flushes (want >= 2 flushes, one sync each)", sy, fl)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(b, []byte(`rtarget_ops_total{op="write"}`)) || !bytes.Contains(b, []byte("rtarget_sessions 1")) {
			t.Fatalf("metrics:\n%s", b)
		}
		resp, err = http.Get("http://" + s.metricsAddr + "/healthz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", err, resp)
		}
	})
}

// fuseDisk is the export as a block device: nbdfuse exposes it as a file,
// losetup makes it /dev/loopN. Everything is undone at test end.
type fuseDisk struct {
	t    *testing.T
	dir  string
	loop string
	mnt  string
	fuse *proc
}

func attach(t *testing.T, uri, dir string) *fuseDisk {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &fuseDisk{t: t, dir: dir}
	pid := dir + ".pid"
	os.Remove(pid)
	d.fuse = start(t, "nbdfuse", "-P", pid, filepath.Join(dir, "disk"), uri)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(pid); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdfuse not ready\n%s", d.fuse.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.loop = strings.TrimSpace(run(t, 30*time.Second, "losetup", "--find", "--show", filepath.Join(dir, "disk")))
	t.Cleanup(d.detach)
	return d
}

func (d *fuseDisk) mount(mnt string) {
	os.MkdirAll(mnt, 0o755)
	run(d.t, time.Minute, "mount", "-t", "ext4", d.loop, mnt)
	d.mnt = mnt
}

func (d *fuseDisk) umount() {
	run(d.t, 2*time.Minute, "umount", d.mnt)
	d.mnt = ""
}

func (d *fuseDisk) detach() {
	if d.mnt != "" {
		exec.Command("umount", d.mnt).Run()
		d.mnt = ""
	}
	if d.loop != "" {
		exec.Command("losetup", "-d", d.loop).Run()
		d.loop = ""
	}
	exec.Command("fusermount3", "-u", d.dir).Run()
	d.fuse.stop(syscall.SIGTERM, 20*time.Second)
}

// TestExt4 makes an ext4 file system through nbdfuse and a loop device,
// writes a file, unmounts, mounts again from a fresh nbdfuse, reads it
// back, and checks the file system with e2fsck.
func TestExt4(t *testing.T) {
	needTools(t, "nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	s := newStack(t, t.TempDir())
	work := t.TempDir()
	data := make([]byte, 8<<20)
	rand.NewChaCha8([32]byte{3}).Read(data)
	d := attach(t, s.uri(), filepath.Join(work, "fuse1"))
	run(t, 2*time.Minute, "mkfs.ext4", "-q", "-F", d.loop)
	d.mount(filepath.Join(work, "mnt"))
	if err := os.WriteFile(filepath.Join(d.mnt, "file"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	d.umount()
	d.detach()

	d = attach(t, s.uri(), filepath.Join(work, "fuse2"))
	d.mount(filepath.Join(work, "mnt"))
	got, err := os.ReadFile(filepath.Join(d.mnt, "file"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file read back after remount differs (err %v)", err)
	}
	d.umount()
	out := run(t, 2*time.Minute, "e2fsck", "-fn", d.loop)
	t.Logf("e2fsck: %s", strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))
}

// TestKill9Durability writes a file and fsyncs it through nbdfuse, kills
// rtarget with SIGKILL, restarts it on the same data: the file is there.
func TestKill9Durability(t *testing.T) {
	needTools(t, "nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "sync")
	dataDir := t.TempDir()
	s := newStack(t, dataDir)
	work := t.TempDir()
	d := attach(t, s.uri(), filepath.Join(work, "fuse1"))
	run(t, 2*time.Minute, "mkfs.ext4", "-q", "-F", d.loop)
	d.mount(filepath.Join(work, "mnt"))
	data := make([]byte, 4<<20)
	rand.NewChaCha8([32]byte{9}).Read(data)
	f, err := os.Create(filepath.Join(d.mnt, "durable"))
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	if err := f.Sync(); err != nil { // fsync: ext4 journal commit, FLUSH/FUA to the target
		t.Fatal(err)
	}
	f.Close()
	run(t, time.Minute, "sync", "-f", d.mnt)
	// The target dies without a chance to sync anything, and comes back on
	// the same data and address. rinit reconnects (replaying only requests
	// that were never acknowledged), so the mounted file system goes on.
	s.target.stop(syscall.SIGKILL, 10*time.Second)
	rt, _ := bins(t)
	s.target = start(t, rt, "serve", "--data", dataDir, "--listen", s.targetAddr, "--volume", "vol:512M")
	waitPort(t, s.targetAddr, s.target)
	got, err := os.ReadFile(filepath.Join(d.mnt, "durable"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file differs after the target restarted (err %v)", err)
	}
	d.umount()
	d.detach()
	s.rinit_.stop(syscall.SIGTERM, 30*time.Second)
	s.target.stop(syscall.SIGKILL, 10*time.Second)

	// A fresh stack on the same data: the file and the file system are whole.
	s2 := newStack(t, dataDir)
	d2 := attach(t, s2.uri(), filepath.Join(work, "fuse2"))
	d2.mount(filepath.Join(work, "mnt"))
	got, err = os.ReadFile(filepath.Join(d2.mnt, "durable"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fsynced file lost or changed after kill -9 (err %v, %d bytes)", err, len(got))
	}
	d2.umount()
	out := run(t, 2*time.Minute, "e2fsck", "-fn", d2.loop)
	t.Logf("e2fsck after kill -9 and restart: %s", lastLine(out))
}

// exitCode is the exit status of a command that ran (-1 if it did not run
// or was killed by a signal, 0 on success).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// TestVolumeImportExport copies an image in and out of a store offline.
func TestVolumeImportExport(t *testing.T) {
	rt, _ := bins(t)
	data := t.TempDir()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	want := randomFile(t, in, 40<<20)
	// Make part of it zero: import keeps it sparse.
	f, _ := os.OpenFile(in, os.O_WRONLY, 0)
	f.WriteAt(make([]byte, 8<<20), 16<<20)
	f.Close()
	want = fileSum(t, in, 40<<20)
	res := run(t, 2*time.Minute, rt, "volume", "import", "--data", data, "img", in)
	t.Logf("%s", strings.TrimSpace(res))
	if !strings.Contains(res, "8M of zero blocks not stored") {
		t.Errorf("import: %s", res)
	}
	list := run(t, time.Minute, rt, "volume", "list", "--data", data)
	if !strings.Contains(list, "img") || !strings.Contains(list, "40M") || !strings.Contains(list, "nqn.2026-11.dev.rnic:img") {
		t.Errorf("list:\n%s", list)
	}
	run(t, 2*time.Minute, rt, "volume", "export", "--data", data, "img", out)
	if got := fileSum(t, out, 40<<20); got != want {
		t.Fatal("exported image differs")
	}
	// An image larger than the volume is refused.
	run(t, time.Minute, rt, "volume", "create", "--data", data, "small", "1M")
	cmd := exec.Command(rt, "volume", "import", "--data", data, "small", in)
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "larger than volume") {
		t.Fatalf("oversized import: %v %s", err, b)
	}
	run(t, time.Minute, rt, "volume", "delete", "--data", data, "small")
}

// TestReloadAndErrors: the volumes serve creates are those of --volume plus
// the config file's lines, and SIGHUP creates the ones the file lists anew
// (each volume once); bad input gives one-line errors and a non-zero exit.
func TestReloadAndErrors(t *testing.T) {
	rt, ri := bins(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "rtarget.conf")
	addr := freePort(t)
	os.WriteFile(conf, []byte("# test\nlisten = "+addr+"\nstore = memory\nvolume = a:1M\n"), 0o644)
	p := start(t, rt, "serve", "--config", conf, "--volume", "c:3M")
	waitPort(t, addr, p)
	// b is new, a and c exist (c, from the command line, is not in the
	// file), and b's second line is a duplicate with another size.
	os.WriteFile(conf, []byte("listen = "+addr+"\nstore = memory\nvolume = a:1M\nvolume = b:2M\nvolume = b:8M\n"), 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.output(), "reloaded volumes") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for name, size := range map[string]string{"a": "1048576", "b": "2097152", "c": "3145728"} {
		out := run(t, 30*time.Second, ri, "info", "--target", addr, "--volume", name)
		if !strings.Contains(out, "size:        "+size+" ") {
			t.Fatalf("info %s after reload:\n%s", name, out)
		}
	}
	log := p.output()
	for _, v := range []string{"a", "b", "c"} {
		if n := strings.Count(log, "msg=\"volume created\" volume="+v+" "); n != 1 {
			t.Errorf("volume %s created %d times:\n%s", v, n, log)
		}
	}
	if !strings.Contains(log, `msg="reloaded volumes" listed=3 created=b`) ||
		strings.Count(log, "volume listed twice with different sizes") != 1 {
		t.Errorf("reload log:\n%s", log)
	}
	for _, c := range []struct {
		bin  string
		args []string
		want string
	}{
		{rt, []string{"serve", "--volume", "x:12Q"}, "invalid size"},
		{rt, []string{"serve", "--listen", "0.0.0.0:0", "--store", "memory"}, "without --secret-file"},
		{rt, []string{"serve", "--store", "nope"}, "want memory or thin"},
		{rt, []string{"serve", "--config", "/nonexistent"}, "config"},
		{ri, []string{"nbd", "--target", "127.0.0.1:1", "--volume", "v", "--listen", freePort(t)}, "connection refused"},
		{ri, []string{"info", "--target", addr}, "--volume is required"},
		{ri, []string{"info", "--target", addr, "--volume", "a", "--secret-file", "/nonexistent"}, "secret file"},
		{ri, []string{"info", "--target", addr, "--volume", "nope"}, "volume"},
	} {
		b, err := exec.Command(c.bin, c.args...).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		last := lines[len(lines)-1]
		if exitCode(err) != 1 || !strings.Contains(last, c.want) {
			t.Errorf("%s %v: exit %v, last line %q (want status 1 and %q)", filepath.Base(c.bin), c.args, err, last, c.want)
		}
	}
	// Usage mistakes: one line naming the command and its --help, no help
	// dump, exit status 2.
	for _, c := range []struct {
		bin  string
		env  string
		args []string
		want string
	}{
		{rt, "", []string{"serve", "--bogus"}, "rtarget serve: flag provided but not defined: -bogus (see rtarget serve --help)"},
		{rt, "", []string{"--bogus"}, "rtarget: flag provided but not defined: -bogus (see rtarget --help)"},
		{rt, "", []string{"bogus"}, `rtarget: unknown command "bogus" (see rtarget --help)`},
		{rt, "", []string{"volume", "bogus"}, `rtarget volume: unknown command "bogus" (see rtarget volume --help)`},
		{rt, "", []string{"volume", "import", "--progress=maybe", "a", "b"},
			`rtarget volume import: invalid boolean value "maybe" for -progress: parse error (see rtarget volume import --help)`},
		{rt, "", []string{"serve", "--listen"}, "rtarget serve: flag needs an argument: -listen (see rtarget serve --help)"},
		{ri, "", []string{"nbd", "--bogus"}, "rinit nbd: flag provided but not defined: -bogus (see rinit nbd --help)"},
		{ri, "", []string{"lock", "acquire", "--hold", "soon"},
			`rinit lock acquire: invalid value "soon" for flag -hold: parse error (see rinit lock acquire --help)`},
		{ri, "", []string{"rping", "-p", "x"}, `rinit rping: invalid value "x" for flag -p: parse error (see rinit rping --help)`},
		{ri, "RINIT_QPS=many", []string{"info"}, `rinit info: could not parse "many" as int value from environment variable "RINIT_QPS" for flag qps`},
	} {
		cmd := exec.Command(c.bin, c.args...)
		if c.env != "" {
			cmd.Env = append(os.Environ(), c.env)
		}
		b, err := cmd.CombinedOutput()
		out := strings.TrimSpace(string(b))
		if exitCode(err) != 2 || strings.Contains(out, "\n") || !strings.HasPrefix(out, c.want) {
			t.Errorf("%s %s %v: exit %v, output:\n%s\nwant status 2 and the one line %q", c.env, filepath.Base(c.bin), c.args, err, out, c.want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"volume", "--help"}, {"volume", "import", "--help"}} {
		if b, err := exec.Command(rt, args...).CombinedOutput(); err != nil || !strings.Contains(string(b), "USAGE") {
			t.Errorf("rtarget %v: %v\n%s", args, err, b)
		}
	}
	for _, args := range [][]string{{"--help"}, {"nbd", "--help"}, {"attach", "--help"}, {"info", "--help"}, {"lock", "acquire", "--help"}, {"lock", "release", "--help"}, {"rping", "--help"}, {"perftest", "--help"}} {
		if b, err := exec.Command(ri, args...).CombinedOutput(); err != nil || !strings.Contains(string(b), "USAGE") {
			t.Errorf("rinit %v: %v\n%s", args, err, b)
		}
	}
}

// TestLockCommands: rinit lock acquire holds a lock (with a pid file),
// status names the holder, a second acquire fails naming it, release stops
// the holder and the target shows the lock free.
func TestLockCommands(t *testing.T) {
	rt, ri := bins(t)
	addr := freePort(t)
	p := start(t, rt, "serve", "--listen", addr, "--store", "memory", "--volume", "v:16M")
	waitPort(t, addr, p)
	pid := filepath.Join(t.TempDir(), "lock.pid")
	holder := start(t, ri, "lock", "acquire", "--target", addr, "--volume", "v", "--lock", "2", "--name", "holder", "--pid-file", pid)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(pid); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid file; holder said:\n%s", holder.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := run(t, 30*time.Second, ri, "lock", "status", "--target", addr, "--volume", "v", "--lock", "2"); !strings.Contains(out, "lock 2: held by initiator holder") {
		t.Fatalf("status: %s", out)
	}
	b, err := exec.Command(ri, "lock", "acquire", "--target", addr, "--volume", "v", "--lock", "2", "--name", "other", "--hold", "1s").CombinedOutput()
	if err == nil || !strings.Contains(string(b), "holder") {
		t.Fatalf("second acquire: %v\n%s", err, b)
	}
	if out := run(t, 30*time.Second, ri, "lock", "release", "--target", addr, "--volume", "v", "--lock", "2", "--pid-file", pid); !strings.Contains(out, "released") {
		t.Fatalf("release: %s", out)
	}
	if err := holder.stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("holder exit: %v\n%s", err, holder.output())
	}
	if !strings.Contains(holder.output(), "lock 2 acquired, fencing token") || !strings.Contains(holder.output(), "released") {
		t.Fatalf("holder output:\n%s", holder.output())
	}
	if out := run(t, 30*time.Second, ri, "lock", "status", "--target", addr, "--volume", "v", "--lock", "2"); !strings.Contains(out, "lock 2: free") {
		t.Fatalf("status after release: %s", out)
	}
	// A pid file that cannot be written fails before the lock is taken.
	bad := filepath.Join(t.TempDir(), "missing", "lock.pid")
	b, err = exec.Command(ri, "lock", "acquire", "--target", addr, "--volume", "v", "--lock", "4", "--pid-file", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "--pid-file") || strings.Contains(string(b), "acquired") {
		t.Fatalf("acquire with an unwritable pid file: %v\n%s", err, b)
	}
	if out := run(t, 30*time.Second, ri, "lock", "status", "--target", addr, "--volume", "v", "--lock", "4"); !strings.Contains(out, "lock 4: free") {
		t.Fatalf("status after the failed acquire: %s", out)
	}
}
