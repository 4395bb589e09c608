package nbd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests against real NBD clients from Debian packages.

var toolPackages = map[string]string{
	"nbdinfo":     "libnbd-bin",
	"nbdcopy":     "libnbd-bin",
	"nbdfuse":     "libnbd-bin",
	"qemu-io":     "qemu-utils",
	"fio":         "fio",
	"nbdkit":      "nbdkit",
	"mkfs.ext4":   "e2fsprogs",
	"e2fsck":      "e2fsprogs",
	"losetup":     "mount",
	"mount":       "mount",
	"umount":      "mount",
	"fusermount3": "fuse3",
}

// needTools skips the test unless every tool is installed.
func needTools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not installed (apt-get install %s)", n, toolPackages[n])
		}
	}
}

// run runs a command and returns its stdout; it fails the test, showing
// stderr, if the command fails.
func run(t testing.TB, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	out, err := runErr(timeout, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// runErr runs a command and returns its combined output.
func runErr(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func nbdURI(s *served, export string) string { return "nbd://" + s.addr + "/" + export }

func TestNbdinfoJSON(t *testing.T) {
	needTools(t, "nbdinfo")
	srv := &Server{Exports: []Export{
		{Name: "vol", Description: "a test volume", Backend: newMem(64 << 20), MultiConn: true},
		{Name: "ro", Backend: newMem(8 << 20), ReadOnly: true, MinBlock: 4096, PrefBlock: 65536, MaxBlock: 1 << 20},
	}}
	s := serve(t, srv)

	type export struct {
		Name        string `json:"export-name"`
		Description string `json:"description"`
		Size        int64  `json:"export-size"`
		ReadOnly    bool   `json:"is_read_only"`
		Flush       bool   `json:"can_flush"`
		FUA         bool   `json:"can_fua"`
		Trim        bool   `json:"can_trim"`
		Zero        bool   `json:"can_zero"`
		MultiConn   bool   `json:"can_multi_conn"`
		Cache       bool   `json:"can_cache"`
		DF          bool   `json:"can_df"`
		FastZero    bool   `json:"can_fast_zero"`
		MinBlock    int64  `json:"block_size_minimum"`
		PrefBlock   int64  `json:"block_size_preferred"`
		MaxBlock    int64  `json:"block_size_maximum"`
	}
	type info struct {
		Protocol   string   `json:"protocol"`
		Structured bool     `json:"structured"`
		Exports    []export `json:"exports"`
	}
	get := func(args ...string) info {
		out := run(t, 30*time.Second, "nbdinfo", append([]string{"--json"}, args...)...)
		var in info
		if err := json.Unmarshal([]byte(out), &in); err != nil {
			t.Fatalf("nbdinfo output: %v\n%s", err, out)
		}
		t.Logf("nbdinfo %s:\n%s", strings.Join(args, " "), out)
		return in
	}

	in := get(nbdURI(s, "vol"))
	if in.Protocol != "newstyle-fixed" || !in.Structured || len(in.Exports) != 1 {
		t.Fatalf("protocol %q structured %v exports %d", in.Protocol, in.Structured, len(in.Exports))
	}
	want := export{Name: "vol", Description: "a test volume", Size: 64 << 20, Flush: true, FUA: true, Trim: true, Zero: true,
		MultiConn: true, MinBlock: 512, PrefBlock: 4096, MaxBlock: 32 << 20}
	if got := in.Exports[0]; got != want {
		t.Errorf("vol:\n got %+v\nwant %+v", got, want)
	}

	in = get(nbdURI(s, "ro"))
	want = export{Name: "ro", Size: 8 << 20, ReadOnly: true, MinBlock: 4096, PrefBlock: 65536, MaxBlock: 1 << 20}
	if got := in.Exports[0]; got != want {
		t.Errorf("ro:\n got %+v\nwant %+v", got, want)
	}

	in = get("--list", nbdURI(s, ""))
	if len(in.Exports) != 2 || in.Exports[0].Name != "vol" || in.Exports[1].Name != "ro" ||
		in.Exports[0].Description != "a test volume" || in.Exports[1].Size != 8<<20 {
		t.Errorf("--list: %+v", in.Exports)
	}
}

// TestNbdinfoMapDefaultExport: nbdinfo --map of the default export (a
// URI without an export name) lists the allocation, as it does for the
// export by its name.
func TestNbdinfoMapDefaultExport(t *testing.T) {
	needTools(t, "nbdinfo")
	be := newMem(1 << 20)
	copy(be.data[8192:], "data")
	s := serve(t, &Server{Exports: []Export{{Name: "vol", Backend: be}}})
	want := run(t, 30*time.Second, "nbdinfo", "--map", nbdURI(s, "vol"))
	if !strings.Contains(want, "data") || !strings.Contains(want, "hole") {
		t.Fatalf("nbdinfo --map of vol:\n%s", want)
	}
	if got := run(t, 30*time.Second, "nbdinfo", "--map", "nbd://"+s.addr); got != want {
		t.Fatalf("nbdinfo --map of the default export:\n%s\nwant\n%s", got, want)
	}
}

func TestUnixSocket(t *testing.T) {
	needTools(t, "nbdinfo")
	m := newMem(16 << 20)
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	cancel, wait := serveOn(t, &Server{Exports: []Export{{Name: "vol", Backend: m}}}, listen(t, "unix", sock))

	out := run(t, 30*time.Second, "nbdinfo", "--size", "nbd+unix:///vol?socket="+sock)
	if strings.TrimSpace(out) != fmt.Sprint(16<<20) {
		t.Errorf("nbdinfo --size over unix socket: %q", out)
	}
	// Data goes through too.
	copy(m.data[4096:], "hello over a unix socket")
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := greet(t, nc, clientFlagFixedNewstyle)
	c.goExport("vol")
	if r := c.do(CmdRead, 0, 4096, 512, nil); r.errno != 0 || !bytes.HasPrefix(r.data, []byte("hello over a unix socket")) {
		t.Fatalf("read over unix socket: errno %d data %q", r.errno, r.data[:24])
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// randomImage writes a file of size bytes of random data with some
// all-zero stretches, and returns its SHA-256.
func randomImage(t testing.TB, path string, size int) [32]byte {
	t.Helper()
	b := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{7})
	_, _ = rng.Read(b)
	for off := 3 << 20; off+(1<<20) <= size; off += 37 << 20 {
		clear(b[off : off+(1<<20)])
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func fileSHA(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestNbdcopy(t *testing.T) {
	needTools(t, "nbdcopy")
	const size = 256 << 20
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	sum := randomImage(t, in, size)
	m := newMem(size)
	s := serve(t, &Server{Exports: []Export{{Name: "vol", Backend: m, MultiConn: true}}})

	start := time.Now()
	run(t, 90*time.Second, "nbdcopy", in, nbdURI(s, "vol"))
	up := time.Since(start)
	if got := sha256.Sum256(m.snapshot(0, size)); got != sum {
		t.Fatal("backend content differs from the image after nbdcopy in")
	}
	start = time.Now()
	run(t, 90*time.Second, "nbdcopy", nbdURI(s, "vol"), out)
	down := time.Since(start)
	if got := fileSHA(t, out); got != sum {
		t.Fatalf("image copied back differs: sha256 %x, want %x", got, sum)
	}
	t.Logf("nbdcopy 256 MiB: in %v (%.0f MiB/s), out %v (%.0f MiB/s); backend writes %d, zeroes %d, trims %d, flushes %d; sha256 %x",
		up.Round(time.Millisecond), 256/up.Seconds(), down.Round(time.Millisecond), 256/down.Seconds(),
		m.writes.Load(), m.zeroes.Load(), m.trims.Load(), m.flushes.Load(), sum)
}

// qemuIO runs qemu-io commands against uri and fails on any error or
// pattern mismatch. The cache mode is writeback: qemu-io's default,
// writethrough, sets FUA on every write.
func qemuIO(t testing.TB, uri string, cmds ...string) string {
	t.Helper()
	args := []string{"-f", "raw", "-t", "writeback"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, uri)
	out, err := runErr(60*time.Second, "qemu-io", args...)
	if err != nil || strings.Contains(out, "Pattern verification failed") || strings.Contains(strings.ToLower(out), "error") {
		t.Fatalf("qemu-io %q: %v\n%s", cmds, err, out)
	}
	return out
}

func TestQemuIO(t *testing.T) {
	needTools(t, "qemu-io")
	m := newMem(64 << 20)
	s := serve(t, &Server{Exports: []Export{{Name: "vol", Backend: m, MultiConn: true}}})
	uri := nbdURI(s, "vol")

	out := qemuIO(t, uri,
		"write -P 0xab 0 1M",
		"read -P 0xab 0 1M",
		"writev -P 0xcd 1M 64k 4k 60k",
		"readv -P 0xcd 1M 64k 64k",
		"aio_write -P 0xef 2M 256k",
		"aio_write -P 0xee 3M 128k",
		"aio_flush",
		"read -P 0xef 2M 256k",
		"read -P 0xee 3M 128k",
		"flush",
		"discard 0 512k",
		"write -z 4M 1M", // NO_HOLE: written as zeroes, memBackend being no AllocatedZeroer
		"read -P 0 4M 1M",
		"write -z -u 1M 128k", // may unmap: WriteZeroes
		"read -P 0 1M 128k",
		"read -P 0xab 512k 512k",
	)
	t.Logf("qemu-io:\n%s", out)
	if !bytes.Equal(m.snapshot(2<<20, 256<<10), bytes.Repeat([]byte{0xef}, 256<<10)) {
		t.Error("backend does not hold the aio_write pattern")
	}
	if m.trims.Load() == 0 || m.zeroes.Load() == 0 {
		t.Errorf("backend saw %d trims and %d write-zeroes, want both > 0", m.trims.Load(), m.zeroes.Load())
	}

	// FUA and FLUSH reach the backend: count against a baseline session,
	// since qemu may flush when it closes the image.
	count := func(cmds ...string) (flushes, fua int64) {
		f0, u0 := m.flushes.Load(), m.fuaWrites.Load()
		qemuIO(t, uri, cmds...)
		return m.flushes.Load() - f0, m.fuaWrites.Load() - u0
	}
	baseFlush, baseFUA := count("read 0 4k")
	flushes, fua := count("read 0 4k", "flush", "flush", "flush")
	if flushes-baseFlush != 3 || fua != baseFUA {
		t.Errorf("3 qemu-io flushes: backend flushes +%d (baseline +%d), FUA +%d", flushes, baseFlush, fua)
	}
	flushes, fua = count("write -f -P 0x11 8M 4k", "write -f -P 0x12 9M 64k", "write -P 0x13 10M 4k")
	if fua != 2 || flushes != baseFlush {
		t.Errorf("2 FUA writes: backend FUA writes +%d, flushes +%d (baseline +%d)", fua, flushes, baseFlush)
	}
	qemuIO(t, uri, "read -P 0x11 8M 4k", "read -P 0x12 9M 64k", "read -P 0x13 10M 4k")
	t.Logf("baseline session flushes %d; backend totals: flushes %d, FUA writes %d, trims %d, zeroes %d (FUA %d)",
		baseFlush, m.flushes.Load(), m.fuaWrites.Load(), m.trims.Load(), m.zeroes.Load(), m.fuaZeroes.Load())
}

// fioResult is the part of fio's JSON output the tests read.
type fioResult struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  struct {
			IOBytes int64   `json:"io_bytes"`
			IOPS    float64 `json:"iops"`
		} `json:"read"`
		Write struct {
			IOBytes int64   `json:"io_bytes"`
			IOPS    float64 `json:"iops"`
		} `json:"write"`
	} `json:"jobs"`
}

func runFio(t testing.TB, timeout time.Duration, args ...string) fioResult {
	t.Helper()
	out := run(t, timeout, "fio", append(args, "--output-format=json", "--verify_state_save=0")...)
	// fio may print notes before the JSON document.
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var r fioResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("fio JSON: %v\n%s", err, out)
	}
	if len(r.Jobs) == 0 {
		t.Fatalf("fio: no jobs in output\n%s", out)
	}
	return r
}

func TestFioVerify(t *testing.T) {
	needTools(t, "fio")
	if out, _ := runErr(10*time.Second, "fio", "--enghelp"); !strings.Contains(out, "nbd") {
		t.Skip("fio has no nbd engine (Debian's fio has it: apt-get install fio)")
	}
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "blocking", true: "async"}[async], func(t *testing.T) {
			var be Backend = newMem(64 << 20)
			var am *asyncMem
			if async {
				am = newAsyncMem(64 << 20)
				be = am
			}
			s := serve(t, &Server{Exports: []Export{{Name: "vol", Backend: be, MultiConn: true}}})
			r := runFio(t, 90*time.Second, "--name=verify", "--ioengine=nbd", "--uri=nbd://"+s.addr+"/",
				"--rw=randrw", "--bs=4k", "--iodepth=32", "--verify=crc32c", "--do_verify=1", "--size=64M")
			j := r.Jobs[0]
			if j.Error != 0 {
				t.Fatalf("fio job error %d", j.Error)
			}
			if j.Write.IOBytes == 0 || j.Read.IOBytes == 0 {
				t.Fatalf("fio moved read %d / write %d bytes", j.Read.IOBytes, j.Write.IOBytes)
			}
			t.Logf("fio randrw+verify crc32c 64M: read %d MiB (%.0f IOPS), write %d MiB (%.0f IOPS), error %d",
				j.Read.IOBytes>>20, j.Read.IOPS, j.Write.IOBytes>>20, j.Write.IOPS, j.Error)
			if am != nil {
				if am.started.Load() == 0 {
					t.Fatal("the server never started a request asynchronously")
				}
				t.Logf("async backend: %d requests started (%d completed inline), %d plugs",
					am.started.Load(), am.inline.Load(), am.plugs.Load())
			}
		})
	}
}
