// Command rbd benchmarks rtarget as a gateway in front of Ceph RBD against
// the peer users would otherwise run, qemu-nbd exporting the same RBD
// image (Debian's qemu-block-extra rbd driver), in the same run on the
// same cluster, interleaved, with fio's nbd engine; and reports `rbd bench`
// on the image as the cluster's own ceiling.
//
//	go run ./bench/rbd                   # 3 repetitions, 5 s per job, the cluster of .ci/ceph-cluster
//	go run ./bench/rbd -conf /etc/ceph/ceph.conf -pool rbd   # an existing cluster
//
// Our stack: rinit nbd -> rtarget-ceph serve --store rbd (built with
// -tags ceph,pacific). The peer: qemu-nbd --cache=none (rbd_cache off,
// like ours) on rbd:POOL/IMAGE. Jobs: bench/jobs randread-4k-qd16,
// randwrite-4k-qd16, seqread-1m and seqwrite-1m over a 256 MiB region of a
// 1 GiB image written once first.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rnic-dev/rnic/internal/benchkit"
)

type options struct {
	conf, pool, image, out string
	reps, runtime, ramp    int
	region                 string
}

var jobs = []string{"randread-4k-qd16", "randwrite-4k-qd16", "seqread-1m", "seqwrite-1m"}

func main() {
	var o options
	flag.StringVar(&o.conf, "conf", os.Getenv("RNIC_CEPH_CONF"), "ceph.conf of the cluster (default: start one with .ci/ceph-cluster)")
	flag.StringVar(&o.pool, "pool", "rbd", "pool of the benchmark image")
	flag.StringVar(&o.image, "image", "rnic-bench", "the benchmark image (created, 1 GiB, if missing)")
	flag.StringVar(&o.out, "out", "bench/results", "directory for rbd-report.md and rbd-results.json")
	flag.IntVar(&o.reps, "reps", 3, "repetitions (systems interleaved in each)")
	flag.IntVar(&o.runtime, "runtime", 5, "seconds per job")
	flag.IntVar(&o.ramp, "ramp", 1, "ramp seconds per job")
	flag.StringVar(&o.region, "region", "256M", "region of the image the jobs use")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(context.Background(), o, log); err != nil {
		log.Error("benchmark failed", "err", err)
		os.Exit(1)
	}
}

// Result is one job on one system in one repetition.
type Result struct {
	System string  `json:"system"`
	Job    string  `json:"job"`
	Rep    int     `json:"rep"`
	IOPS   float64 `json:"iops"`
	MBps   float64 `json:"mbps"`
	// CPUus is the server side's CPU time per I/O (rinit + rtarget, or
	// qemu-nbd), from /proc/PID/stat.
	CPUus float64 `json:"server_cpu_us_per_io"`
}

// Bench is one `rbd bench` run.
type Bench struct {
	What string  `json:"what"`
	IOPS float64 `json:"iops"`
	MBps float64 `json:"mbps"`
}

type system struct {
	name  string
	start func(ctx context.Context, port string) (procs []*exec.Cmd, uri string, err error)
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	work, err := os.MkdirTemp("", "rnic-rbd-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if o.conf == "" {
		dir := filepath.Join(work, "cluster")
		out, err := exec.Command(".ci/ceph-cluster", "start", dir).Output()
		if err != nil {
			return fmt.Errorf("starting the cluster: %w", err)
		}
		defer exec.Command(".ci/ceph-cluster", "stop", dir).Run()
		o.conf = strings.TrimSpace(string(out))
	}
	bin := filepath.Join(work, "bin")
	for _, b := range [][]string{
		{"build", "-tags", "ceph,pacific", "-o", filepath.Join(bin, "rtarget-ceph"), "./cmd/rtarget"},
		{"build", "-o", filepath.Join(bin, "rinit"), "./cmd/rinit"},
	} {
		if out, err := exec.Command("go", b...).CombinedOutput(); err != nil {
			return fmt.Errorf("go %v: %v\n%s", b, err, out)
		}
	}
	if err := exec.Command("timeout", "30", "rbd", "--conf", o.conf, "info", o.pool+"/"+o.image).Run(); err != nil {
		if out, err := exec.Command("timeout", "30", "rbd", "--conf", o.conf, "create", o.pool+"/"+o.image, "--size", "1G").CombinedOutput(); err != nil {
			return fmt.Errorf("rbd create: %v: %s", err, out)
		}
	}
	systems := []system{
		{"rtarget-rbd", func(ctx context.Context, port string) ([]*exec.Cmd, string, error) {
			tport := benchkit.FreePort()
			t := exec.CommandContext(ctx, filepath.Join(bin, "rtarget-ceph"), "serve", "--store", "rbd", "--ceph-conf", o.conf,
				"--rbd-pool", o.pool, "--listen", "127.0.0.1:"+tport)
			if err := benchkit.StartProc(t, filepath.Join(work, "rtarget.log")); err != nil {
				return nil, "", err
			}
			if err := benchkit.WaitPort(tport); err != nil {
				return []*exec.Cmd{t}, "", err
			}
			i := exec.CommandContext(ctx, filepath.Join(bin, "rinit"), "nbd", "--target", "127.0.0.1:"+tport,
				"--volume", o.image, "--listen", "127.0.0.1:"+port)
			if err := benchkit.StartProc(i, filepath.Join(work, "rinit.log")); err != nil {
				return []*exec.Cmd{t}, "", err
			}
			return []*exec.Cmd{t, i}, "nbd://127.0.0.1:" + port + "/" + o.image, nil
		}},
		{"qemu-nbd-rbd", func(ctx context.Context, port string) ([]*exec.Cmd, string, error) {
			q := exec.CommandContext(ctx, "qemu-nbd", "-f", "raw", "--cache=none", "--persistent", "--shared=8",
				"-x", o.image, "-b", "127.0.0.1", "-p", port, "rbd:"+o.pool+"/"+o.image+":conf="+o.conf)
			if err := benchkit.StartProc(q, filepath.Join(work, "qemu-nbd.log")); err != nil {
				return nil, "", err
			}
			return []*exec.Cmd{q}, "nbd://127.0.0.1:" + port + "/" + o.image, nil
		}},
	}
	var results []Result
	// The region is written once, through our stack, so reads read data.
	if err := withSystem(ctx, systems[0], func(uri string, _ []*exec.Cmd) error {
		_, err := fio(ctx, "bench/jobs/fill.fio", uri, o)
		return err
	}); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	for rep := range o.reps {
		for _, sys := range systems {
			log.Info("system", "name", sys.name, "rep", rep)
			err := withSystem(ctx, sys, func(uri string, procs []*exec.Cmd) error {
				for _, j := range jobs {
					cpu0 := benchkit.CPU(procs...)
					r, err := fio(ctx, "bench/jobs/"+j+".fio", uri, o)
					if err != nil {
						return err
					}
					r.System, r.Job, r.Rep = sys.name, j, rep
					if ios := r.IOPS * float64(o.runtime+o.ramp); ios > 0 {
						r.CPUus = (benchkit.CPU(procs...) - cpu0).Seconds() * 1e6 / ios
					}
					log.Info("job", "system", sys.name, "job", j, "iops", int(r.IOPS), "MB/s", int(r.MBps))
					results = append(results, r)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("%s: %w", sys.name, err)
			}
		}
	}
	benches, err := rbdBench(o)
	if err != nil {
		return err
	}
	return report(o, results, benches)
}

// withSystem starts sys, waits for its NBD port, runs fn and stops it
// (SIGTERM, so that it closes the image and releases its lock).
func withSystem(ctx context.Context, sys system, fn func(uri string, procs []*exec.Cmd) error) error {
	port := benchkit.FreePort()
	procs, uri, err := sys.start(ctx, port)
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			benchkit.StopProc(procs[i], 30*time.Second)
		}
	}()
	if err != nil {
		return err
	}
	if err := benchkit.WaitPort(port); err != nil {
		return err
	}
	return fn(uri, procs)
}

func fio(ctx context.Context, job, uri string, o options) (Result, error) {
	r, err := benchkit.Fio(ctx, job, "NBD_URI="+uri, "REGION="+o.region, "RUNTIME="+strconv.Itoa(o.runtime),
		"RAMP="+strconv.Itoa(o.ramp))
	return Result{IOPS: r.IOPS, MBps: r.MBps}, err
}

var benchLine = regexp.MustCompile(`elapsed:\s*([\d.]+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)\s+bytes/sec:\s*([\d.]+)\s*(\w+)?`)

// rbdBench runs `rbd bench` on the image for each job's shape.
func rbdBench(o options) ([]Bench, error) {
	var out []Bench
	for _, b := range []struct{ what, typ, size, threads, pattern, total string }{
		{"randread-4k-qd16", "read", "4K", "16", "rand", "128M"},
		{"randwrite-4k-qd16", "write", "4K", "16", "rand", "64M"},
		{"seqread-1m", "read", "1M", "8", "seq", "1G"},
		{"seqwrite-1m", "write", "1M", "8", "seq", "1G"},
	} {
		res, err := exec.Command("timeout", "300", "rbd", "--conf", o.conf, "bench", "--io-type", b.typ, "--io-size", b.size,
			"--io-threads", b.threads, "--io-pattern", b.pattern, "--io-total", b.total, o.pool+"/"+o.image).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("rbd bench %s: %v: %s", b.what, err, res)
		}
		m := benchLine.FindSubmatch(res)
		if m == nil {
			return nil, fmt.Errorf("rbd bench %s: no summary in %s", b.what, res)
		}
		iops, _ := strconv.ParseFloat(string(m[3]), 64)
		bps, _ := strconv.ParseFloat(string(m[4]), 64)
		switch string(m[5]) {
		case "KiB":
			bps *= 1 << 10
		case "MiB":
			bps *= 1 << 20
		case "GiB":
			bps *= 1 << 30
		}
		out = append(out, Bench{What: b.what, IOPS: iops, MBps: bps / 1e6})
	}
	return out, nil
}

func report(o options, results []Result, benches []Bench) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(map[string]any{"results": results, "rbd_bench": benches}, "", "  ")
	if err := os.WriteFile(filepath.Join(o.out, "rbd-results.json"), js, 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# rtarget (rbd) against qemu-nbd (rbd) on one cluster\n\n")
	fmt.Fprintf(&b, "%d repetitions, systems interleaved, %d s per job after a %d s ramp, %s region of a 1 GiB image. "+
		"Medians; ratio = rtarget/qemu-nbd (target >= 0.8x). Server CPU: rinit + rtarget, or qemu-nbd, per I/O. "+
		"`rbd bench` on the same image is the cluster's own ceiling.\n\n", o.reps, o.runtime, o.ramp, o.region)
	fmt.Fprintf(&b, "| job | rtarget (rbd) | qemu-nbd (rbd) | ratio | rtarget CPU µs/IO | qemu-nbd CPU µs/IO | rbd bench |\n|---|---|---|---|---|---|---|\n")
	get := func(sys, job string, f func(Result) float64) float64 {
		var v []float64
		for _, r := range results {
			if r.System == sys && r.Job == job {
				v = append(v, f(r))
			}
		}
		return benchkit.Median(v)
	}
	for i, j := range jobs {
		unit, f := "IOPS", func(r Result) float64 { return r.IOPS }
		if strings.HasSuffix(j, "1m") {
			unit, f = "MB/s", func(r Result) float64 { return r.MBps }
		}
		ours, peer := get("rtarget-rbd", j, f), get("qemu-nbd-rbd", j, f)
		ceil := benches[i].IOPS
		if unit == "MB/s" {
			ceil = benches[i].MBps
		}
		fmt.Fprintf(&b, "| %s | %.0f %s | %.0f %s | %.2fx | %.0f | %.0f | %.0f %s |\n", j, ours, unit, peer, unit, ours/peer,
			get("rtarget-rbd", j, func(r Result) float64 { return r.CPUus }),
			get("qemu-nbd-rbd", j, func(r Result) float64 { return r.CPUus }), ceil, unit)
	}
	fmt.Fprintf(&b, "\nEvery run:\n\n| system | job | rep | IOPS | MB/s | server CPU µs/IO |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.1f | %.0f |\n", r.System, r.Job, r.Rep, r.IOPS, r.MBps, r.CPUus)
	}
	fmt.Print(b.String())
	return os.WriteFile(filepath.Join(o.out, "rbd-report.md"), []byte(b.String()), 0o644)
}
