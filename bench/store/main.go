// Command store benchmarks the default store (thin) against the memory
// store through the whole stack, fio's nbd engine -> rinit nbd -> rtarget,
// with the targets of the store issue: the same jobs, default flags, the
// two systems interleaved job by job (both stacks up, each job run on one
// right after the other, which one first alternating), the file systems'
// dirty data written back (sync) before each job.
//
//	go run ./bench/store                 # 3 repetitions, 5 s per job, ~8 minutes
//	go run ./bench/store -reps 1 -runtime 3
//	go run ./bench/store -dir /mnt/xfs -out bench/results/xfs   # the stores on another file system
//
// Scenarios, on a new rtarget per system and repetition:
//
//   - full: a 2 GiB volume written once in full (1 MiB sequential), then
//     randread-4k-qd16, randwrite-4k-qd16, seqread-1m and seqwrite-1m over
//     it (bench/jobs);
//   - fresh: writes to a fresh 64 GiB volume never written before:
//     randwrite-4k-qd16 (nearly every write allocates a cluster) and
//     seqwrite-1m;
//   - cow (thin only): right after a snapshot of the full volume, 4 KiB
//     writes at QD16 each to a different 64 KiB cluster (a copy on write),
//     against the same writes once more (the volume's own clusters now),
//     interleaved; and the time of each snapshot, taken through rtarget's
//     control socket while the volume is served: of the full volume after
//     the fresh jobs and after each round of copy-on-write writes, and of
//     the still empty fresh volume right after full's randwrite-4k-qd16;
//     beside each, the file system's own sync time at that moment
//     (Snapshot.SyncMs), the floor of any durable change.
//
// It writes bench/results/store-report.md and store-results.json.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/internal/benchkit"
	"github.com/rnic-dev/rnic/internal/vmmem"
)

type options struct {
	out                string
	reps, runtime, rmp int
	fullSize           string
	cowRounds          int
	steadyMemory       bool
	dir                string
}

// Result is one fio job of one system in one repetition.
type Result struct {
	System   string  `json:"system"`
	Scenario string  `json:"scenario"`
	Job      string  `json:"job"`
	Rep      int     `json:"rep"`
	IOPS     float64 `json:"iops"`
	MBps     float64 `json:"mbps"`
	// CPUus is the CPU time (user and system) of rtarget and rinit per
	// I/O: a figure less sensitive than rates to other load on the host.
	CPUus float64 `json:"cpu_us_per_io"`
	// HWMKiB is rtarget's VmHWM after the scenario's jobs.
	HWMKiB int64 `json:"rtarget_hwm_kib"`
}

// Snapshot is one snapshot taken through the control socket.
type Snapshot struct {
	Rep int     `json:"rep"`
	Ms  float64 `json:"ms"`
	// After says what ran just before the snapshot.
	After string `json:"after"`
	// SyncMs is the reference taken at the same moment: the longer of two
	// 100-byte writes + fdatasync of a file of their own in the store's
	// directory, one just before the snapshot and one just after. A
	// snapshot makes its record durable, so it cannot take less than the
	// file system takes to sync anything; while the page cache writes
	// back gigabytes that can be tens of milliseconds.
	SyncMs float64 `json:"fs_sync_ms"`
}

var fullJobs = []string{"randread-4k-qd16", "randwrite-4k-qd16", "seqread-1m", "seqwrite-1m"}
var freshJobs = []string{"randwrite-4k-qd16", "seqwrite-1m"}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "bench/results", "directory for store-report.md and store-results.json")
	flag.IntVar(&o.reps, "reps", 3, "repetitions (the systems interleaved in each)")
	flag.IntVar(&o.runtime, "runtime", 5, "seconds per job")
	flag.IntVar(&o.rmp, "ramp", 1, "ramp seconds per job")
	flag.StringVar(&o.fullSize, "size", "2G", "size of the volume written in full")
	flag.IntVar(&o.cowRounds, "cow-rounds", 3, "snapshot + first writes + plain writes rounds per repetition")
	flag.BoolVar(&o.steadyMemory, "steady-memory", true, "stop the VM's free page reporting for the run and write once to "+
		"the free memory, so that new page-cache pages cost no fault in the host (see vmmem.SteadyMemory)")
	flag.StringVar(&o.dir, "dir", "", "directory under which the stores are made (default: the temporary directory); "+
		"its file system decides how the thin store writes its data files (store/thin_pool.go, writeChunk)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Interrupted, the run stops its fio and processes and returns, so
	// that what it changed on the machine (-steady-memory) is put back.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o, log)
	stop()
	if err != nil {
		log.Error("benchmark failed", "err", err)
		os.Exit(1)
	}
}

// stack is one rtarget and the rinit nbd processes in front of its volumes.
type stack struct {
	rt    *exec.Cmd
	inits []*exec.Cmd
	uris  map[string]string // volume -> nbd URI
	data  string
	log   string
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	work, err := os.MkdirTemp(o.dir, "rnic-store-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "bin")
	for _, b := range [][]string{{"build", "-o", bin + "/", "./cmd/rtarget", "./cmd/rinit"}} {
		if out, err := exec.Command("go", b...).CombinedOutput(); err != nil {
			return fmt.Errorf("go %v: %v\n%s", b, err, out)
		}
	}
	if o.steadyMemory {
		restore, err := vmmem.SteadyMemory(1<<30, log)
		if err != nil {
			return err
		}
		defer restore()
	}
	var results []Result
	var snaps []Snapshot
	var cow, plain []float64
	for rep := range o.reps {
		r, sn, c, p, err := repetition(ctx, bin, work, rep, o, log)
		if err != nil {
			return err
		}
		results, snaps = append(results, r...), append(snaps, sn...)
		cow, plain = append(cow, c...), append(plain, p...)
	}
	return report(o, results, snaps, cow, plain)
}

// repetition runs every job once on each system, the two systems' stacks
// up side by side and the job run on one right after the other (the
// first system alternating by repetition and by job), so that both see
// the host as it is at that moment; then the copy-on-write rounds on
// thin. Before each job the file systems' dirty data is written back
// (sync), so that no job pays for the writeback of the one before it.
func repetition(ctx context.Context, bin, work string, rep int, o options, log *slog.Logger) (
	results []Result, snaps []Snapshot, cow, plain []float64, err error) {
	stacks := map[string]*stack{}
	defer func() {
		for _, st := range stacks {
			st.stop()
		}
	}()
	systems := []string{"memory", "thin"}
	for _, sys := range systems {
		st, err := startStack(ctx, bin, work, sys, rep, o)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("%s: %w", sys, err)
		}
		stacks[sys] = st
	}
	fail := func(sys string, err error) error {
		return fmt.Errorf("%s: %w\n%s", sys, err, tail(stacks[sys].log))
	}
	for _, sys := range systems {
		if _, err := fio(ctx, "bench/jobs/fill.fio", stacks[sys].uris["full"], o.fullSize, o, nil); err != nil {
			return nil, nil, nil, nil, fail(sys, fmt.Errorf("fill: %w", err))
		}
	}
	k := rep
	for _, sc := range []struct {
		name, vol, region string
		jobs              []string
	}{{"full", "full", o.fullSize, fullJobs}, {"fresh", "fresh", "64G", freshJobs}} {
		for _, j := range sc.jobs {
			order := slices.Clone(systems)
			if k%2 == 1 {
				slices.Reverse(order)
			}
			k++
			for _, sys := range order {
				st := stacks[sys]
				unix.Sync()
				cpu0 := st.cpu()
				r, err := fio(ctx, "bench/jobs/"+j+".fio", st.uris[sc.vol], sc.region, o, nil)
				if err != nil {
					return nil, nil, nil, nil, fail(sys, err)
				}
				if ios := r.IOPS * float64(o.runtime+o.rmp); ios > 0 {
					r.CPUus = (st.cpu() - cpu0).Seconds() * 1e6 / ios
				}
				r.System, r.Scenario, r.Job, r.Rep, r.HWMKiB = sys, sc.name, j, rep, hwm(st.rt)
				log.Info("job", "rep", rep, "system", sys, "scenario", sc.name, "job", j, "iops", int(r.IOPS), "MB/s", int(r.MBps))
				results = append(results, r)
				if sys == "thin" && sc.name == "full" && j == "randwrite-4k-qd16" {
					// A snapshot right after random writes to the
					// other volume (fresh is still empty: its
					// snapshot changes nothing for its jobs).
					sn, err := snapshot(st.data, "fresh", fmt.Sprintf("r%d", rep))
					if err != nil {
						return nil, nil, nil, nil, fail(sys, err)
					}
					sn.Rep, sn.After = rep, "full randwrite-4k-qd16"
					snaps = append(snaps, sn)
				}
			}
		}
	}
	// The memory store's data goes before the copy-on-write rounds.
	stacks["memory"].stop()
	delete(stacks, "memory")
	st := stacks["thin"]
	for round := range o.cowRounds {
		sn, err := snapshot(st.data, "full", fmt.Sprintf("s%d-%d", rep, round))
		if err != nil {
			return nil, nil, nil, nil, fail("thin", err)
		}
		sn.Rep, sn.After = rep, "fresh seqwrite-1m"
		if round > 0 {
			sn.After = "cow writes to it"
		}
		snaps = append(snaps, sn)
		// 256 MiB of the volume: 4096 clusters, one write each.
		env := []string{"IO_SIZE=" + strconv.Itoa(4096*4096)}
		rc, err := fio(ctx, "bench/store/jobs/cow-4k-qd16.fio", st.uris["full"], "256M", o, env)
		if err != nil {
			return nil, nil, nil, nil, fail("thin", err)
		}
		rp, err := fio(ctx, "bench/store/jobs/cow-4k-qd16.fio", st.uris["full"], "256M", o, env)
		if err != nil {
			return nil, nil, nil, nil, fail("thin", err)
		}
		cow, plain = append(cow, rc.IOPS), append(plain, rp.IOPS)
		log.Info("copy on write", "snapshot_ms", sn.Ms, "fs_sync_ms", sn.SyncMs, "first_write_iops", int(rc.IOPS), "plain_iops", int(rp.IOPS))
	}
	return results, snaps, cow, plain, nil
}

// startStack starts rtarget with the given store and volumes full and
// fresh, and a rinit nbd for each.
func startStack(ctx context.Context, bin, work, sys string, rep int, o options) (*stack, error) {
	st := &stack{uris: map[string]string{}, data: filepath.Join(work, fmt.Sprintf("data-%s-%d", sys, rep)),
		log: filepath.Join(work, fmt.Sprintf("rtarget-%s-%d.log", sys, rep))}
	tport := benchkit.FreePort()
	st.rt = exec.CommandContext(ctx, filepath.Join(bin, "rtarget"), "serve", "--store", sys, "--data", st.data,
		"--listen", "127.0.0.1:"+tport, "--volume", "full:"+o.fullSize, "--volume", "fresh:64G")
	if err := benchkit.StartProc(st.rt, st.log); err != nil {
		return nil, err
	}
	if err := benchkit.WaitPort(tport); err != nil {
		st.stop()
		return nil, fmt.Errorf("%w\n%s", err, tail(st.log))
	}
	for _, vol := range []string{"full", "fresh"} {
		port := benchkit.FreePort()
		i := exec.CommandContext(ctx, filepath.Join(bin, "rinit"), "nbd", "--target", "127.0.0.1:"+tport, "--volume", vol,
			"--listen", "127.0.0.1:"+port, "--name", "bench-"+vol)
		if err := benchkit.StartProc(i, filepath.Join(work, fmt.Sprintf("rinit-%s-%s-%d.log", vol, sys, rep))); err != nil {
			st.stop()
			return nil, err
		}
		st.inits = append(st.inits, i)
		if err := benchkit.WaitPort(port); err != nil {
			st.stop()
			return nil, err
		}
		st.uris[vol] = "nbd://127.0.0.1:" + port + "/" + vol
	}
	return st, nil
}

// stop stops the processes and deletes the store: a repetition's jobs
// write several GiB to the fresh volume.
func (st *stack) stop() {
	for _, c := range append(st.inits, st.rt) {
		benchkit.StopProc(c, 60*time.Second)
	}
	os.RemoveAll(st.data)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// cpu returns the CPU time rtarget and the rinit processes used so far.
func (st *stack) cpu() time.Duration { return benchkit.CPU(append(st.inits, st.rt)...) }

// hwm returns the process's VmHWM in KiB.
func hwm(c *exec.Cmd) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Process.Pid))
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// snapshot takes snapshot snap of vol through the control socket of the
// store in dir, and returns how long the request took, with the file
// system's sync time at the same moment (Snapshot.SyncMs).
func snapshot(dir, vol, snap string) (Snapshot, error) {
	before, err := syncProbe(dir)
	if err != nil {
		return Snapshot{}, err
	}
	ms, err := snapshotRequest(filepath.Join(dir, "rtarget.sock"), vol, snap)
	if err != nil {
		return Snapshot{}, err
	}
	after, err := syncProbe(dir)
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Ms: ms, SyncMs: max(before, after)}, nil
}

// syncProbe appends 100 bytes to a file of its own in dir and makes them
// durable with fdatasync, and returns how long that took in milliseconds.
func syncProbe(dir string) (float64, error) {
	f, err := os.OpenFile(filepath.Join(dir, "bench-sync-probe"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("sync probe: %w", err)
	}
	defer f.Close()
	start := time.Now()
	if _, err := f.Write(make([]byte, 100)); err != nil {
		return 0, fmt.Errorf("sync probe: %w", err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return 0, fmt.Errorf("sync probe: fdatasync: %w", err)
	}
	return float64(time.Since(start).Microseconds()) / 1000, nil
}

func snapshotRequest(sock, vol, snap string) (float64, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return 0, fmt.Errorf("control socket: %w", err)
	}
	defer c.Close()
	req, _ := json.Marshal(map[string]any{"v": 1, "op": "snapshot", "name": vol, "snap": snap})
	start := time.Now()
	if _, err := c.Write(append(req, '\n')); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil || resp.Error != "" {
		return 0, fmt.Errorf("snapshot: %v %s", err, resp.Error)
	}
	return float64(d.Microseconds()) / 1000, nil
}

func fio(ctx context.Context, job, uri, region string, o options, env []string) (Result, error) {
	r, err := benchkit.Fio(ctx, job, append([]string{"NBD_URI=" + uri, "REGION=" + region,
		"RUNTIME=" + strconv.Itoa(o.runtime), "RAMP=" + strconv.Itoa(o.rmp)}, env...)...)
	return Result{IOPS: r.IOPS, MBps: r.MBps}, err
}

func report(o options, results []Result, snaps []Snapshot, cow, plain []float64) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(map[string]any{"results": results, "snapshots": snaps, "cow_first_write_iops": cow,
		"cow_plain_iops": plain}, "", "  ")
	if err := os.WriteFile(filepath.Join(o.out, "store-results.json"), js, 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The default store (thin) against the memory store\n\n")
	fmt.Fprintf(&b, "`go run ./bench/store -reps %d -runtime %d`, %s: fio (nbd engine) -> rinit nbd -> rtarget, default flags, "+
		"%d repetitions, each with a new rtarget per system, both up side by side and each job run on one right after the "+
		"other (which one first alternating), the dirty data of the file systems written back (sync) before each job; "+
		"medians; thin/memory is the median of the repetitions' ratios, each of a pair run one right after the other. "+
		"Rates are IOPS (4K) or MB/s (1M). Target: thin >= 0.9x memory. The stores' file system: %s.\n\n", o.reps, o.runtime,
		time.Now().UTC().Format("2006-01-02"), o.reps, fsName(o.dir))
	if o.steadyMemory {
		fmt.Fprintf(&b, "With `-steady-memory` (the default): the VM's free page reporting stopped for the run and its free "+
			"memory written once before the jobs, so that a job growing the page cache pays what a long-running host pays, "+
			"not a fault in the host per new page (vmmem.SteadyMemory).\n\n")
	} else {
		fmt.Fprintf(&b, "With `-steady-memory=false`: jobs that grow the page cache (fresh volumes, copy on write) pay a fault "+
			"in the host for each new page on a VM with free page reporting.\n\n")
	}
	fmt.Fprintf(&b, "| scenario | job | memory | thin | thin/memory | >= 0.9x | CPU µs/IO memory | thin |\n"+
		"|---|---|---|---|---|---|---|---|\n")
	get := func(sys, sc, job string, cpu bool) float64 {
		var v []float64
		for _, r := range results {
			if r.System == sys && r.Scenario == sc && r.Job == job {
				switch {
				case cpu:
					v = append(v, r.CPUus)
				case strings.HasSuffix(job, "-1m"):
					v = append(v, r.MBps)
				default:
					v = append(v, r.IOPS)
				}
			}
		}
		return benchkit.Median(v)
	}
	// ratio is the median over the repetitions of thin/memory, each pair
	// measured one right after the other: the host's drift between
	// repetitions cancels out of each.
	ratio := func(sc, job string) float64 {
		rates := map[int]map[string]float64{}
		for _, r := range results {
			if r.Scenario == sc && r.Job == job {
				if rates[r.Rep] == nil {
					rates[r.Rep] = map[string]float64{}
				}
				rates[r.Rep][r.System] = r.IOPS
			}
		}
		var v []float64
		for _, m := range rates {
			if m["memory"] > 0 && m["thin"] > 0 {
				v = append(v, m["thin"]/m["memory"])
			}
		}
		return benchkit.Median(v)
	}
	for _, sc := range []struct {
		name string
		jobs []string
	}{{"full", fullJobs}, {"fresh", freshJobs}} {
		for _, j := range sc.jobs {
			m, t, q := get("memory", sc.name, j, false), get("thin", sc.name, j, false), ratio(sc.name, j)
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.2fx | %s | %.1f | %.1f |\n", sc.name, j, m, t, q, yes(q >= 0.9),
				get("memory", sc.name, j, true), get("thin", sc.name, j, true))
		}
	}
	var ms []float64
	for _, s := range snaps {
		ms = append(ms, s.Ms)
	}
	if len(cow) > 0 {
		c, p := benchkit.Median(cow), benchkit.Median(plain)
		fmt.Fprintf(&b, "\nCopy on write (thin, 4K QD16, each write to another 64 KiB cluster of a 2 GiB volume written in full):"+
			" right after a snapshot %.0f IOPS, the same writes again %.0f IOPS: a first write to a shared cluster costs "+
			"%.2fx a plain write (target <= 3x: %s).\n", c, p, p/c, yes(p/c <= 3))
		fmt.Fprintf(&b, "\nSnapshots of served volumes through the control socket, each right after a job on the other "+
			"volume or the copy-on-write writes: median %.2f ms, worst %.2f ms (target <= 10 ms: %s).\n",
			benchkit.Median(ms), slices.Max(ms), yes(slices.Max(ms) <= 10))
		for _, after := range []string{"full randwrite-4k-qd16", "fresh seqwrite-1m", "cow writes to it"} {
			var v []float64
			for _, s := range snaps {
				if s.After == after {
					v = append(v, s.Ms)
				}
			}
			if len(v) > 0 {
				fmt.Fprintf(&b, "- after %s: median %.2f ms, worst %.2f ms (%d snapshots)\n", after, benchkit.Median(v), slices.Max(v), len(v))
			}
		}
		fmt.Fprintf(&b, "\nEach snapshot beside the file system's own sync time at that moment (the longer of two 100-byte "+
			"writes + fdatasync of another file in the store's directory, just before and just after it):\n\n"+
			"| repetition | after | snapshot ms | fdatasync ms |\n|---|---|---|---|\n")
		for _, s := range snaps {
			fmt.Fprintf(&b, "| %d | %s | %.2f | %.2f |\n", s.Rep, s.After, s.Ms, s.SyncMs)
		}
	}
	var hw []int64
	for _, r := range results {
		if r.System == "thin" {
			hw = append(hw, r.HWMKiB)
		}
	}
	if len(hw) > 0 {
		fmt.Fprintf(&b, "\nrtarget (thin) VmHWM over these jobs: at most %d MiB.\n", slices.Max(hw)>>10)
	}
	if err := os.WriteFile(filepath.Join(o.out, "store-report.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(b.String())
	return nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// fsName names the file system of dir ("" for the temporary directory).
func fsName(dir string) string {
	if dir == "" {
		dir = os.TempDir()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	// Statfs_t.Type is int32 on some 32-bit architectures, where btrfs's
	// magic number would overflow it: compare as 32-bit patterns.
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return fmt.Sprintf("type 0x%x", st.Type)
}
