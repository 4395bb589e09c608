// Command runner runs bench/: every fio job in bench/jobs against our
// block service and the peer systems a user would otherwise run, repeated
// and interleaved, then writes the results (JSON), a markdown report with
// medians and our/peer ratios, PNG plots, the Go micro-benchmarks, peak RSS
// of our processes and a CPU profile of rinit and rtarget under 4K random
// reads. See bench/README.md.
//
//	go run ./bench/runner                 # full run (about 30 minutes)
//	go run ./bench/runner -quick          # the data path's targets only (about 6 minutes)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/internal/benchkit"
	"github.com/rnic-dev/rnic/internal/childproc"
)

type options struct {
	reps     int
	runtime  int
	ramp     int
	region   string
	size     string
	out      string
	jobsDir  string
	jobs     string
	systems  string
	micro    bool
	profile  bool
	benchDir string
	cpus     int
	quick    bool
	// interleave is "job" (every job on every system in turn) or
	// "system" (every job on one system, then the next system).
	interleave string
	// baseline is a git revision whose rinit and rtarget also run, as
	// rnic-memory@REV, interleaved with the rest (see baselineTable).
	baseline string
}

func main() {
	var o options
	flag.IntVar(&o.reps, "reps", 3, "repetitions of every (system, job), interleaved (see -interleave)")
	flag.IntVar(&o.runtime, "runtime", 4, "seconds per fio job (after the ramp)")
	flag.IntVar(&o.ramp, "ramp", 1, "fio ramp_time seconds")
	flag.StringVar(&o.region, "region", "256m", "bytes of the export the jobs use (fio size=)")
	flag.StringVar(&o.size, "size", "1G", "export size of every system")
	flag.StringVar(&o.out, "out", "bench/results", "output directory")
	flag.StringVar(&o.jobsDir, "jobs-dir", "bench/jobs", "directory of fio job files")
	flag.StringVar(&o.jobs, "jobs", "", "comma-separated job names (default: all)")
	flag.StringVar(&o.systems, "systems", "", "comma-separated system names (default: all)")
	flag.BoolVar(&o.micro, "micro", true, "run the Go micro-benchmarks")
	flag.BoolVar(&o.profile, "profile", true, "profile rinit and rtarget under 4K random reads")
	flag.IntVar(&o.cpus, "cpus", -1, "--cpus of rinit and rtarget in the rnic-memory and rnic-thin systems (-1: not passed, their default)")
	flag.StringVar(&o.interleave, "interleave", "job", "job: all systems run at once and each job runs on every system in turn "+
		"(the runs a ratio compares are seconds apart); system: each system runs alone through every job, then the next")
	flag.StringVar(&o.baseline, "baseline", "", "also run "+ours+" built from this git revision (as "+ours+"@REV), interleaved "+
		"with the other systems, and report ours against it job by job: the A/B comparison of a change")
	flag.BoolVar(&o.quick, "quick", false, "only what the data path's targets need: "+strings.Join(quickSystems, ", ")+
		" on "+strings.Join(quickJobs, ", ")+", 3 repetitions of 3 s (after a 1 s ramp), the engine micro-benchmark pairs; "+
		"prints the target table (results in a temporary directory unless -out is given)")
	flag.Parse()
	if o.interleave != "job" && o.interleave != "system" {
		fmt.Fprintf(os.Stderr, "runner: -interleave %q: want job or system\n", o.interleave)
		os.Exit(2)
	}
	if o.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("runtime", func() { o.runtime = 3 })
		def("jobs", func() { o.jobs = strings.Join(quickJobs, ",") })
		def("systems", func() { o.systems = strings.Join(quickSystems, ",") })
		def("profile", func() { o.profile = false })
		def("out", func() { o.out = filepath.Join(os.TempDir(), "rnic-bench-quick") })
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(context.Background(), o, log); err != nil {
		log.Error("bench failed", "err", err)
		os.Exit(1)
	}
}

// Result is one fio job run on one system.
type Result struct {
	System    string             `json:"system"`
	Job       string             `json:"job"`
	Rep       int                `json:"rep"`
	ReadIOPS  float64            `json:"read_iops"`
	WriteIOPS float64            `json:"write_iops"`
	ReadMBps  float64            `json:"read_mbps"`
	WriteMBps float64            `json:"write_mbps"`
	ClatUs    map[string]float64 `json:"clat_percentiles_us,omitempty"` // read latency: total (lat_percentiles=1 jobs) or completion
	Errors    int                `json:"errors"`
	// CPUus is the CPU time (user + system) the system's server processes
	// used during the job, in µs per I/O.
	CPUus float64 `json:"server_cpu_us_per_io"`
	// HostIdle is the share of all the host's CPU time that was idle
	// during the fio run (idle and iowait in /proc/stat), in percent: a
	// stack that leaves CPUs idle while fio waits for it is bound by its
	// latency (wake-ups, hand-offs), not by the CPU it uses.
	HostIdle float64 `json:"host_idle_percent"`
}

// Idle is the CPU our processes used, logged in and with no I/O, over a
// few seconds after the jobs of one repetition.
type Idle struct {
	System     string  `json:"system"`
	Rep        int     `json:"rep"`
	CPUPercent float64 `json:"cpu_percent"` // of one CPU
}

// RSS is the peak resident set of our processes in one repetition.
type RSS struct {
	System string `json:"system"`
	Rep    int    `json:"rep"`
	Proc   string `json:"proc"`
	PeakKB int64  `json:"peak_kb"`
}

type report struct {
	Started  time.Time `json:"started"`
	Host     string    `json:"host"`
	CPUs     int       `json:"cpus"`
	Options  string    `json:"options"`
	Results  []Result  `json:"results"`
	RSS      []RSS     `json:"rss"`
	Idle     []Idle    `json:"idle"`
	Versions []string  `json:"versions"`
	// Load is /proc/loadavg when the run started and when it ended: how
	// busy the (shared) machine was.
	Load [2]string `json:"loadavg"`
	// CPUIdle is the host's cpuidle policy: how long an idle CPU polls
	// before it halts decides what each wake-up costs on a VM, and with it
	// the ratios at 4 KiB (bench/README.md, "Server CPU per I/O").
	CPUIdle string `json:"cpuidle"`
	// Baseline is the git revision of -baseline, or empty.
	Baseline string `json:"baseline,omitempty"`
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for _, tool := range []string{"fio", "nbdkit", "nbd-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not installed (make deps installs it): %w", tool, err)
		}
	}
	work, err := os.MkdirTemp("", "rnic-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "bin")
	log.Info("building rtarget and rinit")
	if out, err := exec.Command("go", "build", "-o", bin+"/", "./cmd/rtarget", "./cmd/rinit").CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	jobs, err := listJobs(o)
	if err != nil {
		return err
	}
	systems := allSystems(bin, o.size, o.cpus)
	if o.systems != "" {
		systems = pick(systems, strings.Split(o.systems, ","))
	} else {
		systems = slices.DeleteFunc(systems, func(s system) bool { return s.optional })
	}
	if o.baseline != "" {
		base, err := buildBaseline(o.baseline, work, log)
		if err != nil {
			return err
		}
		systems = append(systems, system{name: baselineName(o.baseline), title: "rinit -> rtarget (memory store) at " + o.baseline,
			ours: true, start: ourStack(filepath.Join(base, "rtarget"), filepath.Join(base, "rinit"), o.size, "memory", o.cpus)})
	}
	if len(systems) == 0 {
		return errors.New("no systems selected")
	}
	host, _ := os.Hostname()
	rep := report{Started: time.Now().UTC(), Host: host, CPUs: numCPU(), Load: [2]string{loadavg()}, CPUIdle: cpuIdle(),
		Options: fmt.Sprintf("reps=%d runtime=%ds ramp=%ds region=%s size=%s interleave=%s, rinit and rtarget %s", o.reps,
			o.runtime, o.ramp, o.region, o.size, o.interleave, cpusText(o.cpus)),
		Versions: versions(), Baseline: o.baseline}

	for r := 1; r <= o.reps; r++ {
		res, rss, idle, err := runRep(ctx, systems, jobs, r, o, work, log)
		if err != nil {
			return err
		}
		rep.Results = append(rep.Results, res...)
		rep.RSS = append(rep.RSS, rss...)
		rep.Idle = append(rep.Idle, idle...)
	}
	rep.Load[1] = loadavg()
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), b, 0o644); err != nil {
		return err
	}
	var micro, prof string
	if o.profile {
		if prof, err = profileRun(ctx, bin, o, work, log); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	if o.micro {
		log.Info("Go micro-benchmarks")
		if micro, err = microBenchmarks(ctx, o, work); err != nil {
			return fmt.Errorf("micro-benchmarks: %w", err)
		}
		if err := os.WriteFile(filepath.Join(o.out, "micro.txt"), []byte(micro), 0o644); err != nil {
			return err
		}
	}
	md := markdown(rep, jobs, systems, micro, prof)
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if err := plots(rep, jobs, systems, o.out); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	fmt.Printf("\n%s; load average %s -> %s; %s\n\n%s\n%s\nHost CPU left idle during each job (%% of all CPUs, median):\n\n%s\n%s%s\n%s\n",
		rep.Options, rep.Load[0], rep.Load[1], rep.CPUIdle, targetTable(rep), idleTable(rep), hostIdleTable(rep, jobs, systems),
		baselineSection(rep, jobs), microTable(micro), "report: "+filepath.Join(o.out, "report.md"))
	log.Info("done", "report", filepath.Join(o.out, "report.md"))
	return nil
}

func cpusText(cpus int) string {
	if cpus < 0 {
		return "with default flags"
	}
	return "--cpus " + strconv.Itoa(cpus)
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cpuIdle describes the host's cpuidle driver and governor and, for
// the haltpoll driver of KVM guests, how long an idle vCPU polls before
// it halts (guest_halt_poll_ns; 0: it halts at once).
func cpuIdle() string {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	d := read("/sys/devices/system/cpu/cpuidle/current_driver")
	if d == "?" {
		return "cpuidle driver unknown"
	}
	s := "cpuidle driver " + d + ", governor " + read("/sys/devices/system/cpu/cpuidle/current_governor")
	if d == "haltpoll" {
		s += ", guest_halt_poll_ns " + read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
	}
	return s
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func versions() []string {
	var v []string
	for _, c := range [][]string{{"go", "version"}, {"fio", "--version"}, {"nbdkit", "--version"}} {
		out, _ := exec.Command(c[0], c[1:]...).Output()
		v = append(v, strings.TrimSpace(string(out)))
	}
	return v
}

func listJobs(o options) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(o.jobsDir, "*.fio"))
	if err != nil {
		return nil, err
	}
	var jobs []string
	for _, p := range m {
		n := strings.TrimSuffix(filepath.Base(p), ".fio")
		if n != "fill" {
			jobs = append(jobs, n)
		}
	}
	sort.Strings(jobs)
	if o.jobs != "" {
		want := strings.Split(o.jobs, ",")
		var keep []string
		for _, j := range jobs {
			for _, w := range want {
				if j == w {
					keep = append(keep, j)
				}
			}
		}
		jobs = keep
	}
	if len(jobs) == 0 {
		return nil, errors.New("no fio jobs selected")
	}
	return jobs, nil
}

// proc is a started process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	log     *os.File
	pidFile string // a daemon that forked: the pid to signal is in here
}

func startProc(work, name string, args ...string) (*proc, error) {
	lf, err := os.CreateTemp(work, name+"-*.log")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	childproc.DieWithParent(cmd, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{name: name, cmd: cmd, log: lf}, nil
}

// peakKB is VmHWM of the process.
func (p *proc) peakKB() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return 0
}

func (p *proc) stop() error {
	if p.pidFile != "" {
		b, _ := os.ReadFile(p.pidFile)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		p.log.Close()
		return err
	case <-time.After(30 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
		p.log.Close()
		return fmt.Errorf("%s did not stop on SIGTERM", p.name)
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log.Name())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitPort(port int, procs []*proc) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	var tails []string
	for _, p := range procs {
		tails = append(tails, p.name+": "+p.tail())
	}
	return fmt.Errorf("nothing listens on %s after 30 s\n%s", addr, strings.Join(tails, "\n"))
}

// waitListen waits for a listening socket on port without connecting.
func waitListen(port int, procs []*proc) error {
	want := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/net/tcp")
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) > 3 && strings.HasSuffix(f[1], want[:len(want)-1]) && f[3] == "0A" {
				return nil
			}
		}
	}
	return fmt.Errorf("nothing listens on port %d after 30 s: %s", port, procs[0].tail())
}

// fio runs one job file against uri.
func fio(ctx context.Context, jobFile, uri string, o options) (Result, error) {
	j, err := benchkit.RunFio(ctx, jobFile, "NBD_URI="+uri, "REGION="+o.region,
		"RUNTIME="+strconv.Itoa(o.runtime), "RAMP="+strconv.Itoa(o.ramp))
	if err != nil && j.Error == 0 {
		return Result{}, err
	}
	r := Result{ReadIOPS: j.Read.IOPS, WriteIOPS: j.Write.IOPS, ReadMBps: float64(j.Read.BwBytes) / 1e6,
		WriteMBps: float64(j.Write.BwBytes) / 1e6, Errors: j.Error}
	// Total latency (submission to completion) where the job asks for its
	// percentiles (lat_percentiles=1), else completion latency: with fio's
	// nbd engine a request can spend most of its life in submission.
	pct := j.Read.Lat.Percentile
	if len(pct) == 0 {
		pct = j.Read.Clat.Percentile
	}
	if len(pct) == 0 {
		pct = j.Write.Clat.Percentile
	}
	if len(pct) > 0 {
		r.ClatUs = map[string]float64{}
		for k, v := range pct {
			if f, err := strconv.ParseFloat(k, 64); err == nil {
				r.ClatUs[strconv.FormatFloat(f, 'f', -1, 64)] = v / 1000
			}
		}
	}
	return r, err // err: the job reported an error (r says which)
}

// running is a system started for a repetition: its processes and URI.
type running struct {
	sys   system
	procs []*proc
	uri   string
	dir   string
}

func (r *running) stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].stop()
	}
	r.procs = nil
	os.RemoveAll(r.dir)
}

// startSystem starts sys in a directory of its own under work and fills
// its benchmark region. The caller stops it (also after an error).
func startSystem(ctx context.Context, sys system, o options, work string) (*running, error) {
	dir, err := os.MkdirTemp(work, sys.name)
	if err != nil {
		return nil, err
	}
	procs, uri, err := sys.start(dir, work, nil)
	r := &running{sys: sys, procs: procs, uri: uri, dir: dir}
	if err != nil {
		return r, err
	}
	if _, err := fio(ctx, filepath.Join(o.jobsDir, "fill.fio"), uri, o); err != nil {
		return r, fmt.Errorf("%s: fill: %w", sys.name, err)
	}
	return r, nil
}

// runJob runs one fio job against a started system and measures the CPU
// its processes used and the host's idle share meanwhile.
func runJob(ctx context.Context, rs *running, job string, rep int, o options, log *slog.Logger) (Result, error) {
	cpu0 := cpuSeconds(rs.procs)
	busy0, idle0 := hostTicks()
	r, err := fio(ctx, filepath.Join(o.jobsDir, job+".fio"), rs.uri, o)
	if err != nil {
		return r, fmt.Errorf("%s rep %d: %w", rs.sys.name, rep, err)
	}
	if busy1, idle1 := hostTicks(); busy1+idle1 > busy0+idle0 {
		r.HostIdle = 100 * float64(idle1-idle0) / float64(busy1+idle1-busy0-idle0)
	}
	// I/Os over the ramp too, at the measured rate: the CPU time
	// covers the whole fio run.
	if ios := (r.ReadIOPS + r.WriteIOPS) * float64(o.runtime+o.ramp); ios > 0 {
		r.CPUus = (cpuSeconds(rs.procs) - cpu0) / ios * 1e6
	}
	r.System, r.Job, r.Rep = rs.sys.name, job, rep
	log.Info("fio", "system", rs.sys.name, "job", job, "rep", rep, "read_iops", int(r.ReadIOPS), "write_iops", int(r.WriteIOPS),
		"read_MBps", int(r.ReadMBps), "write_MBps", int(r.WriteMBps), "cpu_us_per_io", int(r.CPUus),
		"host_idle_percent", int(r.HostIdle))
	return r, nil
}

// oursAtRest records the peak RSS of our processes and the CPU they use
// logged in with nothing to do (their pollers must park, not spin).
func oursAtRest(rs *running, rep int, log *slog.Logger) ([]RSS, []Idle) {
	var rss []RSS
	for _, p := range rs.procs {
		rss = append(rss, RSS{System: rs.sys.name, Rep: rep, Proc: p.name, PeakKB: p.peakKB()})
	}
	const idleFor = 2 * time.Second
	time.Sleep(500 * time.Millisecond) // past the last job's tail
	cpu0 := cpuSeconds(rs.procs)
	time.Sleep(idleFor)
	pct := (cpuSeconds(rs.procs) - cpu0) / idleFor.Seconds() * 100
	log.Info("idle", "system", rs.sys.name, "rep", rep, "cpu_percent", pct)
	return rss, []Idle{{System: rs.sys.name, Rep: rep, CPUPercent: pct}}
}

// runRep runs repetition rep of every job on every system.
//
// By job (the default): every system is started and filled first, then
// each job runs on every system in turn before the next job, the
// systems' order rotated from one repetition to the next. The runs a
// ratio compares are then seconds apart, not the minute a system's whole
// series of jobs takes, so the host's drift (on these shared machines
// IOPS move by tens of percent within minutes) barely enters the
// ratios. The systems not being measured are idle, logged in and
// holding their memory, and after each job the file systems are synced,
// so that one system's writeback does not run in the next one's job.
//
// By system: each system runs alone, started, filled, run through every
// job and stopped before the next starts.
func runRep(ctx context.Context, systems []system, jobs []string, rep int, o options, work string,
	log *slog.Logger) (res []Result, rss []RSS, idle []Idle, err error) {
	var up []*running
	defer func() {
		for _, rs := range up {
			rs.stop()
		}
	}()
	start := func(sys system) (*running, error) {
		log.Info("system", "name", sys.name, "rep", rep)
		rs, err := startSystem(ctx, sys, o, work)
		if rs != nil {
			up = append(up, rs)
		}
		if err != nil {
			return nil, fmt.Errorf("%s rep %d: %w", sys.name, rep, err)
		}
		return rs, nil
	}
	atRest := func(rs *running) {
		if rs.sys.ours {
			r, i := oursAtRest(rs, rep, log)
			rss, idle = append(rss, r...), append(idle, i...)
		}
	}
	if o.interleave == "system" {
		for _, sys := range systems {
			rs, err := start(sys)
			if err != nil {
				return nil, nil, nil, err
			}
			for _, j := range jobs {
				r, err := runJob(ctx, rs, j, rep, o, log)
				if err != nil {
					return nil, nil, nil, err
				}
				res = append(res, r)
			}
			atRest(rs)
			rs.stop()
			up = up[:0]
		}
		return res, rss, idle, nil
	}
	var order []*running
	for _, sys := range systems {
		rs, err := start(sys)
		if err != nil {
			return nil, nil, nil, err
		}
		order = append(order, rs)
	}
	k := (rep - 1) % len(order)
	order = append(order[k:], order[:k]...)
	for _, j := range jobs {
		for _, rs := range order {
			r, err := runJob(ctx, rs, j, rep, o, log)
			if err != nil {
				return nil, nil, nil, err
			}
			res = append(res, r)
			// The page cache the job dirtied (file-backed systems) is
			// written back now, not during the next system's job.
			unix.Sync()
		}
	}
	for _, rs := range order {
		atRest(rs)
	}
	return res, rss, idle, nil
}

// system is one block service under test, reachable at an NBD URI.
type system struct {
	name, title string
	ours        bool
	// optional systems run only when -systems names them.
	optional bool
	start    func(dir, work string, extra map[string][]string) ([]*proc, string, error)
}

// ourStack starts rtarget serve (with store) and rinit nbd in front of it,
// from the binaries rtarget and rinit, exporting a volume of size; cpus <
// 0: with their default flags.
func ourStack(rtarget, rinit, size, store string, cpus int) func(dir, work string, extra map[string][]string) ([]*proc, string, error) {
	var cpuFlag []string
	if cpus >= 0 {
		cpuFlag = []string{"--cpus", strconv.Itoa(cpus)}
	}
	return func(dir, work string, extra map[string][]string) ([]*proc, string, error) {
		tp, err := freePort()
		if err != nil {
			return nil, "", err
		}
		np, err := freePort()
		if err != nil {
			return nil, "", err
		}
		targs := []string{rtarget, "serve", "--listen", "127.0.0.1:" + strconv.Itoa(tp), "--volume", "bench:" + size,
			"--store", store, "--data", filepath.Join(dir, "data"), "--log-level", "warn"}
		targs = append(targs, cpuFlag...)
		t, err := startProc(work, "rtarget", append(targs, extra["rtarget"]...)...)
		if err != nil {
			return nil, "", err
		}
		procs := []*proc{t}
		if err := waitPort(tp, procs); err != nil {
			return procs, "", err
		}
		iargs := []string{rinit, "nbd", "--target", "127.0.0.1:" + strconv.Itoa(tp), "--volume", "bench",
			"--listen", "127.0.0.1:" + strconv.Itoa(np), "--log-level", "warn"}
		iargs = append(iargs, cpuFlag...)
		i, err := startProc(work, "rinit", append(iargs, extra["rinit"]...)...)
		if err != nil {
			return procs, "", err
		}
		procs = append(procs, i)
		if err := waitPort(np, procs); err != nil {
			return procs, "", err
		}
		return procs, fmt.Sprintf("nbd://127.0.0.1:%d/bench", np), nil
	}
}

func allSystems(bin, size string, cpus int) []system {
	rtarget, rinit := filepath.Join(bin, "rtarget"), filepath.Join(bin, "rinit")
	nbdkit := func(args ...string) func(dir, work string, _ map[string][]string) ([]*proc, string, error) {
		return func(dir, work string, _ map[string][]string) ([]*proc, string, error) {
			p, err := freePort()
			if err != nil {
				return nil, "", err
			}
			a := append([]string{"nbdkit", "-f", "-i", "127.0.0.1", "-p", strconv.Itoa(p)}, args...)
			for i := range a {
				a[i] = strings.ReplaceAll(a[i], "{DIR}", dir)
			}
			if strings.Contains(strings.Join(args, " "), "{DIR}/disk") {
				if err := truncate(filepath.Join(dir, "disk"), size); err != nil {
					return nil, "", err
				}
			}
			k, err := startProc(work, "nbdkit", a...)
			if err != nil {
				return nil, "", err
			}
			procs := []*proc{k}
			return procs, fmt.Sprintf("nbd://127.0.0.1:%d/", p), waitPort(p, procs)
		}
	}
	return []system{
		{name: "rnic-memory", title: "rinit -> rtarget (memory store)", ours: true, start: ourStack(rtarget, rinit, size, "memory", cpus)},
		{name: "rnic-thin", title: "rinit -> rtarget (thin store, the default)", ours: true, start: ourStack(rtarget, rinit, size, "thin", cpus)},
		{name: "nbdkit-memory", title: "nbdkit memory", start: nbdkit("memory", size)},
		{name: "nbdkit-file", title: "nbdkit file", start: nbdkit("file", "{DIR}/disk")},
		{name: "nbd-server", title: "nbd-server (file)", start: func(dir, work string, _ map[string][]string) ([]*proc, string, error) {
			p, err := freePort()
			if err != nil {
				return nil, "", err
			}
			disk := filepath.Join(dir, "disk")
			if err := truncate(disk, size); err != nil {
				return nil, "", err
			}
			conf := filepath.Join(dir, "nbd-server.conf")
			c := fmt.Sprintf("[generic]\n    listenaddr = 127.0.0.1\n    port = %d\n[bench]\n    exportname = %s\n", p, disk)
			if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
				return nil, "", err
			}
			// nbd-server -d would serve a single connection; it daemonizes
			// instead and is stopped through its pid file. The port is
			// probed by its listening socket, not by connecting.
			pid := filepath.Join(dir, "nbd-server.pid")
			s, err := startProc(work, "nbd-server", "nbd-server", "-C", conf, "-p", pid)
			if err != nil {
				return nil, "", err
			}
			s.pidFile = pid
			procs := []*proc{s}
			return procs, fmt.Sprintf("nbd://127.0.0.1:%d/bench", p), waitListen(p, procs)
		}},
		{name: "nbdkit-proxy", title: "nbdkit nbd plugin -> nbdkit memory", start: func(dir, work string, _ map[string][]string) ([]*proc, string, error) {
			back, err := freePort()
			if err != nil {
				return nil, "", err
			}
			front, err := freePort()
			if err != nil {
				return nil, "", err
			}
			b, err := startProc(work, "nbdkit-backend", "nbdkit", "-f", "-i", "127.0.0.1", "-p", strconv.Itoa(back), "memory", size)
			if err != nil {
				return nil, "", err
			}
			procs := []*proc{b}
			if err := waitPort(back, procs); err != nil {
				return procs, "", err
			}
			f, err := startProc(work, "nbdkit-proxy", "nbdkit", "-f", "-i", "127.0.0.1", "-p", strconv.Itoa(front), "nbd",
				"hostname=127.0.0.1", "port="+strconv.Itoa(back))
			if err != nil {
				return procs, "", err
			}
			procs = append(procs, f)
			return procs, fmt.Sprintf("nbd://127.0.0.1:%d/", front), waitPort(front, procs)
		}},
		{name: "rnic-memory-cpus1", title: "rinit -> rtarget (memory store), --cpus 1", ours: true, optional: true,
			start: ourStack(rtarget, rinit, size, "memory", 1)},
	}
}

// cpuSeconds is the CPU time (user + system, children reaped included)
// of every process in the process groups of procs: a system's servers
// with whatever they forked (nbd-server serves each connection in a child
// of its daemon, whose group its pid file names).
func cpuSeconds(procs []*proc) float64 {
	groups := map[int]bool{}
	for _, p := range procs {
		groups[p.cmd.Process.Pid] = true
		if p.pidFile != "" {
			if b, err := os.ReadFile(p.pidFile); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					groups[pid] = true
				}
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ... : fields after the comm's ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		if pg, _ := strconv.Atoi(f[2]); !groups[pg] {
			continue
		}
		for _, k := range f[11:15] { // utime stime cutime cstime
			n, _ := strconv.ParseInt(k, 10, 64)
			ticks += n
		}
	}
	return float64(ticks) / 100 // USER_HZ
}

// hostTicks returns the host's busy and idle (idle + iowait) CPU time so
// far, in USER_HZ ticks summed over all CPUs (the cpu line of /proc/stat);
// zeros if it cannot be read.
func hostTicks() (busy, idle int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal (guest time is
	// already in user and nice).
	for i, k := range f[1:9] {
		n, _ := strconv.ParseInt(k, 10, 64)
		if i == 3 || i == 4 {
			idle += n
		} else {
			busy += n
		}
	}
	return busy, idle
}

func truncate(path, size string) error {
	n, err := parseSize(size)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(n)
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

func pick(all []system, names []string) []system {
	var out []system
	for _, n := range names {
		for _, s := range all {
			if s.name == n {
				out = append(out, s)
			}
		}
	}
	return out
}

// profileRun profiles rinit and rtarget (memory store) under the 4K random
// read QD16 job and returns pprof's top functions of each. The profiles are
// taken over HTTP (rtarget --metrics-listen, rinit --debug-listen) while the
// job runs, so the fill before it is not in them.
func profileRun(ctx context.Context, bin string, o options, work string, log *slog.Logger) (string, error) {
	log.Info("CPU profile under randread-4k-qd16")
	sys := allSystems(bin, o.size, o.cpus)[0]
	dir, err := os.MkdirTemp(work, "profile")
	if err != nil {
		return "", err
	}
	mp, err := freePort()
	if err != nil {
		return "", err
	}
	dp, err := freePort()
	if err != nil {
		return "", err
	}
	maddr, daddr := "127.0.0.1:"+strconv.Itoa(mp), "127.0.0.1:"+strconv.Itoa(dp)
	procs, uri, err := sys.start(dir, work, map[string][]string{"rtarget": {"--metrics-listen", maddr}, "rinit": {"--debug-listen", daddr}})
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	if err != nil {
		return "", err
	}
	if _, err := fio(ctx, filepath.Join(o.jobsDir, "fill.fio"), uri, o); err != nil {
		return "", err
	}
	const seconds = 6
	po := o
	po.runtime, po.ramp = seconds+3, 1
	tprof, iprof := filepath.Join(o.out, "rtarget.pprof"), filepath.Join(o.out, "rinit.pprof")
	errs := make(chan error, 3)
	go func() {
		_, err := fio(ctx, filepath.Join(o.jobsDir, "randread-4k-qd16.fio"), uri, po)
		errs <- err
	}()
	time.Sleep(2 * time.Second) // past fio's start and ramp
	for _, p := range []struct{ addr, file string }{{maddr, tprof}, {daddr, iprof}} {
		go func() {
			errs <- fetch(ctx, "http://"+p.addr+"/debug/pprof/profile?seconds="+strconv.Itoa(seconds), p.file)
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			return "", err
		}
	}
	var sb strings.Builder
	for _, p := range []struct{ name, bin, prof string }{{"rinit", filepath.Join(bin, "rinit"), iprof}, {"rtarget", filepath.Join(bin, "rtarget"), tprof}} {
		out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=25", p.bin, p.prof).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("pprof %s: %v\n%s", p.name, err, out)
		}
		fmt.Fprintf(&sb, "### %s\n\n```\n%s```\n\n", p.name, trimPprof(string(out)))
	}
	return sb.String(), nil
}

// fetch saves the body of url in file.
func fetch(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch %s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	return f.Close()
}

func trimPprof(s string) string {
	var keep []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n") + "\n"
}

// engineBench selects the engine's benchmark pairs (ours, then raw Go TCP
// doing the same on the same loopback) and the message and atomic rates.
const engineBench = "^(BenchmarkWriteStream|BenchmarkTCPStream|BenchmarkTCPSendmsg|BenchmarkRead4K|BenchmarkTCPPingPong4K|BenchmarkSendRecv|BenchmarkFetchAdd)$"

// microBenchmarks runs the Go benchmarks the report quotes: the engine's
// pairs three times over (each run has every pair side by side, so drift
// hits both sides alike) and, unless quick, the other packages' once.
func microBenchmarks(ctx context.Context, o options, work string) (string, error) {
	var sb strings.Builder
	bin := filepath.Join(work, "rnic.test")
	if out, err := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, microPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go test -c %s: %v\n%s", microPkg, err, out)
	}
	for i := 1; i <= 3; i++ {
		cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", engineBench, "-test.benchtime", "1s")
		cmd.Dir = microPkg
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s -test.bench: %v\n%s", microPkg, err, out)
		}
		fmt.Fprintf(&sb, "$ go test -run '^$' -bench '%s' -benchtime 1s %s   # run %d of 3\n%s\n", engineBench, microPkg, i, out)
	}
	if o.quick {
		return sb.String(), nil
	}
	for _, b := range []struct{ pkg, re, time string }{
		{"./rnic/crc32c", ".", "300ms"},
		{"./blockproto", ".", "300ms"},
		{"./initiator", ".", "1000x"},
	} {
		cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", b.re, "-benchtime", b.time, b.pkg)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go test -bench %s: %v\n%s", b.pkg, err, out)
		}
		fmt.Fprintf(&sb, "$ go test -run '^$' -bench %s -benchtime %s %s\n%s\n", b.re, b.time, b.pkg, out)
	}
	return sb.String(), nil
}

// baselineName is the system name of the baseline at revision rev.
func baselineName(rev string) string { return ours + "@" + rev }

// buildBaseline builds rtarget and rinit at git revision rev (the tree of
// rev exported with git archive into work, built with this module cache)
// and returns the directory of the binaries.
func buildBaseline(rev, work string, log *slog.Logger) (string, error) {
	src, bin := filepath.Join(work, "baseline-src"), filepath.Join(work, "baseline-bin")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	log.Info("building the baseline", "rev", rev)
	archive := exec.Command("sh", "-c", `git archive --format=tar "$0" | tar -x -C "$1"`, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("-baseline %s: git archive: %w\n%s", rev, err, out)
	}
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/rtarget", "./cmd/rinit")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("-baseline %s: go build: %w\n%s", rev, err, out)
	}
	return bin, nil
}
