// Package nvmfbench compares rtarget's NVMe/RDMA front end with the Linux
// kernel's own target (nvmet-rdma on a brd RAM disk), both inside one
// Linux VM, against the same kernel host (nvme-rdma over the same siw),
// with the same fio jobs. See ../README.md.
//
//	RNIC_NVMF_BENCH=1 go test ./bench/nvmf -run TestNVMfBench -v -timeout 40m
//
// Flags (after -args): -reps, -runtime, -jobs, -cpus, -profile, -out, -siw.
package nvmfbench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/gobuild"
	"github.com/rnic-dev/rnic/internal/linuxvm"
)

var (
	reps    = flag.Int("reps", 5, "repetitions of every (job, target), interleaved")
	runtim  = flag.Int("runtime", 4, "seconds of each fio run (after 1 s of ramp)")
	jobList = flag.String("jobs", "", "comma-separated job names (default: all)")
	out     = flag.String("out", "", "directory for nvmf.md and nvmf.json (default: bench/results)")
	profJob = flag.String("profile", "randwrite-4k-qd16", "job during whose first rtarget run a CPU profile of rtarget is taken (nvmf-rtarget.pprof)")
	cpus    = flag.Int("cpus", 1, "rtarget --cpus (GOMAXPROCS; 0: all the guest's CPUs); 1, as bench/runner runs it")
	siw     = flag.String("siw", "stock", "siw build: stock or crc1 (nvmet-rdma cannot serve crc1: MPA revision 1 gives it ORD 0)")
)

// job is one fio job: its name and the fio options that make it.
type job struct {
	name string
	args string
	// qd16 / big: the targets of the issue (IOPS at QD16, bandwidth at 1M).
	goal bool
	bw   bool // reported in MB/s
}

var jobs = []job{
	{"randread-4k-qd1", "--rw=randread --bs=4k --iodepth=1", false, false},
	{"randwrite-4k-qd1", "--rw=randwrite --bs=4k --iodepth=1", false, false},
	{"randread-4k-qd16", "--rw=randread --bs=4k --iodepth=16", true, false},
	{"randwrite-4k-qd16", "--rw=randwrite --bs=4k --iodepth=16", true, false},
	{"seqread-1m", "--rw=read --bs=1m --iodepth=8", true, true},
	{"seqwrite-1m", "--rw=write --bs=1m --iodepth=8", true, true},
}

// The two targets, as named in the results.
const (
	ours = "rtarget"
	peer = "nvmet"
)

const region = "512M"

// guest runs inside the VM: both targets on 10.0.2.15 (the host reaches
// them over its own address: loopback, no QEMU networking in the path),
// the kernel host connected to both, a fill, then every job on each
// target in turn, the order alternating per repetition.
const guest = `
set -u
R={{REPS}}; T={{RUNTIME}}; JOBS="{{JOBS}}"; A=10.0.2.15
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5b1f0c8e-0000-4000-8000-00000000be0c
mkdir -p /etc/nvme /host/res; echo $HOSTNQN > /etc/nvme/hostnqn; echo 5b1f0c8e-0000-4000-8000-00000000be0c > /etc/nvme/hostid
modprobe nvme-rdma && modprobe nvmet-rdma && modprobe brd rd_nr=1 rd_size=524288 || { echo "BENCH modprobe failed"; exit 3; }
mount -t configfs none /sys/kernel/config
C=/sys/kernel/config/nvmet; LNQN=nqn.2026-11.dev.example:ram0
mkdir $C/subsystems/$LNQN && echo 1 > $C/subsystems/$LNQN/attr_allow_any_host
mkdir $C/subsystems/$LNQN/namespaces/1 && echo -n /dev/ram0 > $C/subsystems/$LNQN/namespaces/1/device_path
echo 1 > $C/subsystems/$LNQN/namespaces/1/enable
mkdir $C/ports/1 && echo rdma > $C/ports/1/addr_trtype && echo ipv4 > $C/ports/1/addr_adrfam
echo $A > $C/ports/1/addr_traddr && echo 4420 > $C/ports/1/addr_trsvcid
ln -s $C/subsystems/$LNQN $C/ports/1/subsystems/$LNQN
/host/rtarget serve --store memory --listen $A:4421 --nvmf-listen $A:4421 --insecure --volume bench:512M \
  --nvmf-host bench=$HOSTNQN --log-level warn --metrics-listen $A:9420 --cpus {{CPUS}} > /host/rtarget.log 2>&1 &
RP=$!
cpu() { awk '{print $14 + $15}' /proc/$RP/stat; } # rtarget's user + system CPU, in ticks of 10 ms
dev() { for b in /sys/block/nvme*n*; do n=${b##*/}; [ -e "$b" ] || continue; case $n in *c*) continue;; esac
  [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && echo /dev/$n; done; }
for i in $(seq 50); do nvme connect -t rdma -a $A -s 4421 -n nqn.2026-11.dev.rnic:bench >/dev/null 2>&1 && break; sleep 0.5; done
nvme connect -t rdma -a $A -s 4420 -n $LNQN || { echo "BENCH connect nvmet failed"; exit 4; }
sleep 1
RD=$(dev nqn.2026-11.dev.rnic:bench); LD=$(dev $LNQN)
[ -n "$RD" ] && [ -n "$LD" ] || { echo "BENCH no devices: '$RD' '$LD'"; nvme list; exit 5; }
echo "BENCH devices rtarget=$RD nvmet=$LD $(cat /sys/block/${RD#/dev/}/queue/max_hw_sectors_kb)K max I/O"
F="--ioengine=libaio --direct=1 --size=512M --output-format=json --eta=never"
for d in $RD $LD; do fio --name=fill --filename=$d $F --rw=write --bs=1m --iodepth=4 --output=/dev/null; done
echo "BENCH filled"
for r in $(seq $R); do
  order="rtarget nvmet"; [ $((r % 2)) = 0 ] && order="nvmet rtarget"
  for j in $JOBS; do
    args=$(cat /host/jobs/$j)
    for t in $order; do
      d=$RD; [ $t = nvmet ] && d=$LD
      W=; c0=$(cpu)
      if [ $r = 1 ] && [ $t = rtarget ] && [ $j = "{{PROFJOB}}" ]; then
        (sleep 1; wget -q -O /host/rtarget.pprof "http://$A:9420/debug/pprof/profile?seconds=$((T-1))") & W=$!
      fi
      fio --name=$j --filename=$d $F $args --time_based --runtime=$T --ramp_time=1 --norandommap --randrepeat=0 \
        --lat_percentiles=1 --output=/host/res/$r-$j-$t.json || echo "BENCH fio failed $r $j $t"
      [ -n "$W" ] && wait $W
      [ $t = rtarget ] && echo "$c0 $(cpu)" > /host/res/$r-$j-$t.cpu
    done
  done
  echo "BENCH rep $r done"
done
nvme disconnect-all
kill -TERM $RP; wait $RP
echo BENCH-DONE
`

func TestNVMfBench(t *testing.T) {
	if os.Getenv("RNIC_NVMF_BENCH") == "" {
		t.Skip("set RNIC_NVMF_BENCH=1 to run the NVMe/RDMA benchmark (several minutes in the VM)")
	}
	cache := linuxvm.TestCache(t)
	sel := jobs
	if *jobList != "" {
		sel = nil
		for _, j := range jobs {
			if slices.Contains(strings.Split(*jobList, ","), j.name) {
				sel = append(sel, j)
			}
		}
	}
	share := t.TempDir()
	if b, err := gobuild.Build([]string{"CGO_ENABLED=0"}, "-o", filepath.Join(share, "rtarget"), "github.com/rnic-dev/rnic/cmd/rtarget"); err != nil {
		t.Fatalf("static rtarget: %v\n%s", err, b)
	}
	os.MkdirAll(filepath.Join(share, "jobs"), 0o755)
	var names []string
	for _, j := range sel {
		os.WriteFile(filepath.Join(share, "jobs", j.name), []byte(j.args), 0o644)
		names = append(names, j.name)
	}
	script := strings.NewReplacer("{{REPS}}", fmt.Sprint(*reps), "{{RUNTIME}}", fmt.Sprint(*runtim),
		"{{JOBS}}", strings.Join(names, " "), "{{PROFJOB}}", *profJob, "{{CPUS}}", fmt.Sprint(*cpus)).Replace(guest)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := linuxvm.Run(ctx, linuxvm.Config{CacheDir: cache, Variant: linuxvm.Variant(*siw), GuestScript: script,
		ShareDir: share, MemoryMiB: 2048, Timeout: 38 * time.Minute, Log: func(l string) {
			if strings.HasPrefix(l, "BENCH") || strings.HasPrefix(l, "RNICVM") {
				t.Logf("guest: %s", l)
			}
		}})
	if err != nil {
		if res != nil {
			for _, l := range res.Lines[max(0, len(res.Lines)-40):] {
				t.Logf("guest: %s", l)
			}
		}
		b, _ := os.ReadFile(filepath.Join(share, "rtarget.log"))
		t.Fatalf("VM: %v\nrtarget log:\n%s", err, b)
	}
	t.Logf("VM ran %v", time.Since(start).Round(time.Second))
	runs, err := collect(filepath.Join(share, "res"), sel)
	if err != nil {
		t.Fatal(err)
	}
	md := report(runs, sel, time.Now(), *reps, *runtim, *siw)
	fmt.Println(md)
	dir := *out
	if dir == "" {
		dir = filepath.Join("..", "results")
	}
	if err := os.WriteFile(filepath.Join(dir, "nvmf.md"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	if prof, err := os.ReadFile(filepath.Join(share, "rtarget.pprof")); err == nil {
		// Go's CPU profiles carry their symbols: go tool pprof -top FILE.
		os.WriteFile(filepath.Join(dir, "nvmf-rtarget.pprof"), prof, 0o644)
	}
	b, _ := json.MarshalIndent(runs, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "nvmf.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// run is one fio run's figures.
type run struct {
	Rep    int     `json:"rep"`
	Job    string  `json:"job"`
	Target string  `json:"target"`
	IOPS   float64 `json:"iops"`
	MBps   float64 `json:"mb_s"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	// CPUus is rtarget's CPU time (user + system) per I/O, in µs of the
	// emulated CPU (rtarget runs only).
	CPUus float64 `json:"cpu_us_per_io,omitempty"`
}

// fioJSON is the part of fio's JSON output read here.
type fioJSON struct {
	Jobs []struct {
		Error int `json:"error"`
		Read  dir `json:"read"`
		Write dir `json:"write"`
	} `json:"jobs"`
}

type dir struct {
	IOPS    float64 `json:"iops"`
	BWBytes float64 `json:"bw_bytes"`
	Lat     struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"lat_ns"`
}

func collect(resDir string, sel []job) ([]run, error) {
	var runs []run
	for r := 1; r <= *reps; r++ {
		for _, j := range sel {
			for _, tgt := range []string{ours, peer} {
				b, err := os.ReadFile(filepath.Join(resDir, fmt.Sprintf("%d-%s-%s.json", r, j.name, tgt)))
				if err != nil {
					return nil, err
				}
				var f fioJSON
				if err := json.Unmarshal(b[strings.IndexByte(string(b), '{'):], &f); err != nil || len(f.Jobs) == 0 {
					return nil, fmt.Errorf("%d-%s-%s: %v", r, j.name, tgt, err)
				}
				if f.Jobs[0].Error != 0 {
					return nil, fmt.Errorf("%d-%s-%s: fio error %d", r, j.name, tgt, f.Jobs[0].Error)
				}
				d := f.Jobs[0].Read
				if strings.Contains(j.args, "write") {
					d = f.Jobs[0].Write
				}
				ru := run{Rep: r, Job: j.name, Target: tgt, IOPS: d.IOPS, MBps: d.BWBytes / 1e6,
					P50us: d.Lat.Percentile["50.000000"] / 1e3, P99us: d.Lat.Percentile["99.000000"] / 1e3}
				if c, err := os.ReadFile(filepath.Join(resDir, fmt.Sprintf("%d-%s-%s.cpu", r, j.name, tgt))); err == nil {
					var a, b float64
					if n, _ := fmt.Sscan(string(c), &a, &b); n == 2 && d.IOPS > 0 {
						// ticks of 10 ms over the run (ramp included: 1 s more than measured)
						ru.CPUus = (b - a) * 1e4 / (d.IOPS * float64(*runtim+1))
					}
				}
				runs = append(runs, ru)
			}
		}
	}
	return runs, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func report(runs []run, sel []job, when time.Time, reps, rt int, variant string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# NVMe/RDMA: rtarget vs Linux nvmet-rdma\n\n")
	fmt.Fprintf(&b, "Run %s on %d host CPUs (the VM: 2 vCPUs under QEMU TCG, 2 GiB). One Linux 6.1 guest runs both targets "+
		"and the kernel host (nvme-rdma over siw, %s build) connected to each over the guest's own address: rtarget serve "+
		"--store memory (the static binary over 9p) on a 512 MiB volume, nvmet-rdma on a 512 MiB brd RAM disk. Both "+
		"filled first; fio libaio direct on the block devices, %d s per run after 1 s of ramp, %d repetitions with "+
		"the targets' order alternating; the figures are medians. Latency is fio's total latency (submission to "+
		"completion). The ratio is the median of the repetitions' ratios (each pair ran back to back); rtarget runs with "+
		"--cpus %d. rtarget's CPU per I/O is its user + system time during the run (ramp included) over its I/Os, "+
		"in µs of the emulated CPU: comparable between versions of rtarget, not with a real machine.\n\n", when.UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), variant, rt, reps, *cpus)
	fmt.Fprintf(&b, "| Job | unit | rtarget | nvmet | ratio | goal | rtarget p50 / p99 µs | nvmet p50 / p99 µs | rtarget CPU µs/I/O |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|\n")
	for _, j := range sel {
		med := func(tgt string, f func(run) float64) float64 {
			var v []float64
			for _, r := range runs {
				if r.Job == j.name && r.Target == tgt {
					v = append(v, f(r))
				}
			}
			return median(v)
		}
		metric := func(r run) float64 { return r.IOPS }
		unit := "IOPS"
		if j.bw {
			metric, unit = func(r run) float64 { return r.MBps }, "MB/s"
		}
		o, p := med(ours, metric), med(peer, metric)
		// The ratio is the median of each repetition's ratio: the two
		// runs of a repetition are adjacent, so drift on the machine
		// touches both alike.
		var ratios []float64
		for _, ro := range runs {
			for _, rp := range runs {
				if ro.Job == j.name && rp.Job == j.name && ro.Rep == rp.Rep && ro.Target == ours && rp.Target == peer && metric(rp) > 0 {
					ratios = append(ratios, metric(ro)/metric(rp))
				}
			}
		}
		ratio := "-"
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.2fx", median(ratios))
		}
		goal := ""
		if j.goal {
			goal = ">= 0.8x"
		}
		p50 := func(r run) float64 { return r.P50us }
		p99 := func(r run) float64 { return r.P99us }
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %s | %s | %.0f / %.0f | %.0f / %.0f | %.0f |\n", j.name, unit, o, p, ratio, goal,
			med(ours, p50), med(ours, p99), med(peer, p50), med(peer, p99), med(ours, func(r run) float64 { return r.CPUus }))
	}
	fmt.Fprintf(&b, "\nEvery run:\n\n| rep | job | target | IOPS | MB/s | p50 µs | p99 µs | CPU µs/I/O |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %d | %s | %s | %.0f | %.1f | %.0f | %.0f | %.0f |\n", r.Rep, r.Job, r.Target, r.IOPS, r.MBps, r.P50us, r.P99us, r.CPUus)
	}
	return b.String()
}
