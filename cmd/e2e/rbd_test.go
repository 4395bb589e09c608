//go:build ceph

package e2e

// rtarget as a gateway in front of Ceph RBD (rtarget-ceph, --store rbd) on
// the single-node cluster of .ci/ceph-cluster: real NBD clients through
// rinit, gateway failover with fencing, and a full cluster.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/cephtest"
	"github.com/rnic-dev/rnic/internal/gobuild"
)

var cephConf string

func TestMain(m *testing.M) {
	code := cephtest.Main(m, &cephConf)
	removeBins()
	os.Exit(code)
}

var (
	cephBuildOnce sync.Once
	cephBin       string
	cephBuildErr  error
)

// cephTarget builds rtarget with the rbd store (make ceph's bin/rtarget-ceph).
func cephTarget(t *testing.T) string {
	t.Helper()
	bins(t)
	cephBuildOnce.Do(func() {
		cephBin = filepath.Join(binDir, "rtarget-ceph")
		out, err := gobuild.Build(nil, "-tags", "ceph,pacific", "-o", cephBin, "github.com/rnic-dev/rnic/cmd/rtarget")
		if err != nil {
			cephBuildErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if cephBuildErr != nil {
		t.Fatal(cephBuildErr)
	}
	return cephBin
}

// gateway is one rtarget-ceph serving a pool (namespace).
type gateway struct {
	p             *proc
	addr, metrics string
}

// startGateway runs rtarget-ceph serve on pool spec with the volume list.
func startGateway(t *testing.T, spec string, extra ...string) *gateway {
	t.Helper()
	g := &gateway{addr: freePort(t), metrics: freePort(t)}
	args := append([]string{"serve", "--store", "rbd", "--ceph-conf", cephConf, "--rbd-pool", spec,
		"--listen", g.addr, "--metrics-listen", g.metrics}, extra...)
	g.p = start(t, cephTarget(t), args...)
	waitPort(t, g.addr, g.p)
	return g
}

func (g *gateway) metric(t *testing.T, name string) int {
	s := &stack{metricsAddr: g.metrics}
	return s.metric(t, name)
}

// rbdNamespace is a fresh RADOS namespace of the test cluster's pool,
// removed with its images when the test ends.
func rbdNamespace(t *testing.T) string {
	c := cephtest.Connect(t, cephConf, 20*time.Second)
	return cephtest.Namespace(t, cephConf, c)
}

// startRinit exports volume vol of the targets (comma-separated) over NBD.
func startRinit(t *testing.T, targets string, extra ...string) (uri string, p *proc) {
	t.Helper()
	_, ri := bins(t)
	nbd := freePort(t)
	args := append([]string{"nbd", "--target", targets, "--volume", "vol", "--listen", nbd, "--name", "e2e-rbd"}, extra...)
	p = start(t, ri, args...)
	waitPort(t, nbd, p)
	return "nbd://" + nbd + "/vol", p
}

// fioVerify writes 64 MiB at random (4 KiB, QD32) through uri and then
// reads every block back checking its crc32c (fio verify).
func fioVerify(uri string) (fioResult, string, error) {
	return runFio(context.Background(), uri, "--name=verify", "--rw=randwrite", "--iodepth=32", "--size=64M")
}

func checkFio(t *testing.T, what string, r fioResult, out string, err error) {
	t.Helper()
	if err != nil || r.Error != 0 || r.Write.IOBytes != 64<<20 || r.Read.IOBytes != 64<<20 {
		t.Fatalf("%s: fio %+v, %v\n%s", what, r, err, out)
	}
	t.Logf("%s: fio randwrite 4k QD32 64 MiB + verify: error=%d, wrote %d MiB, verified %d MiB", what, r.Error,
		r.Write.IOBytes>>20, r.Read.IOBytes>>20)
}

// TestRBDClients: nbdcopy round-trips 256 MiB byte-identical through
// rinit -> rtarget (rbd), and fio verify passes at iodepth 32.
func TestRBDClients(t *testing.T) {
	needTools(t, "nbdcopy", "fio")
	spec := rbdNamespace(t)
	g := startGateway(t, spec, "--volume", "vol:256M")
	uri, _ := startRinit(t, g.addr)

	t.Run("nbdcopy-256M", func(t *testing.T) {
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
		want := randomFile(t, in, 256<<20)
		t0 := time.Now()
		run(t, 5*time.Minute, "nbdcopy", "--flush", in, uri)
		t1 := time.Now()
		run(t, 5*time.Minute, "nbdcopy", uri, out)
		t.Logf("nbdcopy 256 MiB through rtarget (rbd): in %s (%.0f MB/s), out %s", t1.Sub(t0).Round(time.Millisecond),
			256*1.048576/t1.Sub(t0).Seconds(), time.Since(t1).Round(time.Millisecond))
		if got := fileSum(t, out, 256<<20); got != want {
			t.Fatalf("image read back differs: %x != %x", got, want)
		}
	})
	t.Run("fio-verify-qd32", func(t *testing.T) {
		r, out, err := fioVerify(uri)
		checkFio(t, "rtarget (rbd)", r, out, err)
	})
}

// failoverRig is two gateways on one image and rinit using both, with a
// short heartbeat so that a stopped gateway is left quickly.
func failoverRig(t *testing.T) (a, b *gateway, uri string, ri *proc) {
	spec := rbdNamespace(t)
	a = startGateway(t, spec, "--volume", "vol:128M")
	b = startGateway(t, spec, "--volume", "vol:128M")
	uri, ri = startRinit(t, a.addr+","+b.addr, "--heartbeat", "200ms", "--heartbeat-timeout", "2s")
	return a, b, uri, ri
}

// fioAsync is fioVerify in the background.
type fioRun struct {
	r   fioResult
	out string
	err error
}

func fioAsync(uri string) <-chan fioRun {
	ch := make(chan fioRun, 1)
	go func() {
		r, out, err := fioVerify(uri)
		ch <- fioRun{r, out, err}
	}()
	return ch
}

// waitWrites waits until gateway g has acknowledged some writes.
func waitWrites(t *testing.T, g *gateway, n int) {
	deadline := time.Now().Add(time.Minute)
	for g.metric(t, `rtarget_ops_total{op="write"}`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway saw fewer than %d writes in a minute", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRBDFailoverKill9: fio verify through rinit with two gateways; the
// active one is killed -9 in the middle; rinit moves to the other, which
// takes the image over, and fio ends with 0 errors.
func TestRBDFailoverKill9(t *testing.T) {
	needTools(t, "fio")
	a, b, uri, _ := failoverRig(t)
	done := fioAsync(uri)
	waitWrites(t, a, 2000)
	a.p.stop(syscall.SIGKILL, 10*time.Second)
	t0 := time.Now()
	f := <-done
	checkFio(t, "kill -9 of the active gateway", f.r, f.out, f.err)
	t.Logf("fio ended %s after the kill; the other gateway served %d writes", time.Since(t0).Round(time.Millisecond),
		b.metric(t, `rtarget_ops_total{op="write"}`))
	if b.metric(t, `rtarget_ops_total{op="write"}`) == 0 {
		t.Fatal("the second gateway served no write: rinit did not move")
	}
}

// TestRBDFailoverStop: the active gateway is SIGSTOPped under fio verify;
// rinit's heartbeat gives up on it and moves to the other gateway, which
// breaks its lock (blocklisting it) and raises the fencing epoch; then the
// stopped gateway is continued: the commands it still had are refused by
// the cluster (fenced), it ends its sessions, and fio's data verifies.
func TestRBDFailoverStop(t *testing.T) {
	needTools(t, "fio")
	a, b, uri, _ := failoverRig(t)
	done := fioAsync(uri)
	waitWrites(t, a, 2000)
	if err := a.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			a.p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// Wait for the other gateway to take over and serve writes.
	waitWrites(t, b, 500)
	if err := a.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	f := <-done
	checkFio(t, "SIGSTOP/SIGCONT of the active gateway", f.r, f.out, f.err)
	// The continued gateway found itself fenced: the commands it had
	// taken in before the stop were refused by the cluster.
	deadline := time.Now().Add(20 * time.Second)
	for a.metric(t, "rtarget_volumes_fenced_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the continued gateway never saw the volume fenced:\n%s", a.p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(a.p.output(), "volume fenced") {
		t.Fatalf("no fencing in the continued gateway's log:\n%s", a.p.output())
	}
	if !strings.Contains(b.p.output(), "took the volume over") {
		t.Fatalf("the second gateway did not break the first one's lock:\n%s", b.p.output())
	}
	t.Logf("gateway A after SIGCONT: %d volume(s) fenced: %s", a.metric(t, "rtarget_volumes_fenced_total"),
		lineWith(a.p.output(), "volume fenced"))
	t.Logf("gateway B: %s", lineWith(b.p.output(), "took the volume over"))
}

func lineWith(s, sub string) string {
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestRBDFullCluster: with the cluster full (its full ratio lowered under
// what the OSD uses), a write through rinit fails with an I/O error at the
// NBD client within the gateway's --ceph-timeout instead of hanging.
func TestRBDFullCluster(t *testing.T) {
	needTools(t, "qemu-io")
	spec := rbdNamespace(t)
	const timeout = 3 * time.Second
	g := startGateway(t, spec, "--volume", "vol:64M", "--ceph-timeout", timeout.String())
	uri, _ := startRinit(t, g.addr)
	run(t, time.Minute, "qemu-io", "-f", "raw", uri, "-c", "write -P 0x5a 0 1M")

	mon := cephtest.Connect(t, cephConf, 20*time.Second)
	ratios := func(near, backfill, full float64) {
		for _, c := range []struct {
			prefix string
			ratio  float64
		}{{"osd set-nearfull-ratio", near}, {"osd set-backfillfull-ratio", backfill}, {"osd set-full-ratio", full}} {
			if _, _, err := mon.MonCommand(map[string]any{"prefix": c.prefix, "ratio": c.ratio}); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore := func() { ratios(0.85, 0.90, 0.95) }
	t0 := time.Now()
	ratios(0.0001, 0.0002, 0.0003)
	defer restore()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, err := mon.MonCommand(map[string]any{"prefix": "health", "format": "json"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "OSD_FULL") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not report full within 30 s: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("cluster full after %v", time.Since(t0).Round(time.Millisecond))
	// The OSD and the gateway's client learn of the full flag from the
	// next OSD maps: write until a write fails, each write bounded.
	var out []byte
	var el time.Duration
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t0 := time.Now()
		out, _ = exec.CommandContext(ctx, "qemu-io", "-f", "raw", uri, "-c",
			fmt.Sprintf("write -P 0xa5 %dM 64k", 4+i%32)).CombinedOutput()
		el = time.Since(t0)
		cancel()
		if strings.Contains(string(out), "error") || time.Now().After(deadline.Add(30*time.Second)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("write to a full cluster: %q after %v", strings.TrimSpace(string(out)), el.Round(time.Millisecond))
	if !strings.Contains(string(out), "Input/output error") {
		t.Fatalf("qemu-io did not see an I/O error:\n%s", out)
	}
	if el > timeout+time.Second {
		t.Fatalf("the error took %v, timeout %v", el, timeout)
	}
	// Reads still work, and writes do again once the cluster has room.
	run(t, time.Minute, "qemu-io", "-f", "raw", uri, "-c", "read -P 0x5a 0 1M")
	t.Logf("failing write seen after %v", time.Since(t0).Round(time.Millisecond))
	restore()
	defer func() { t.Logf("writes work again after %v", time.Since(t0).Round(time.Millisecond)) }()
	deadline = time.Now().Add(60 * time.Second)
	for {
		out, err := exec.Command("qemu-io", "-f", "raw", uri, "-c", "write -P 0xa5 4M 64k", "-c", "read -P 0xa5 4M 64k").CombinedOutput()
		if err == nil && !strings.Contains(string(out), "error") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes still fail a minute after the cluster has room:\n%s", out)
		}
		time.Sleep(time.Second)
	}
}
