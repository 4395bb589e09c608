package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// metric is what a job is judged by: IOPS for 4K jobs, MB/s for 1M ones.
func metric(job string, r Result) float64 {
	if strings.Contains(job, "-1m") {
		return r.ReadMBps + r.WriteMBps
	}
	return r.ReadIOPS + r.WriteIOPS
}

func unit(job string) string {
	if strings.Contains(job, "-1m") {
		return "MB/s"
	}
	return "IOPS"
}

func medians(rep report) map[string]map[string]float64 {
	vals := map[string]map[string][]float64{}
	for _, r := range rep.Results {
		if vals[r.Job] == nil {
			vals[r.Job] = map[string][]float64{}
		}
		vals[r.Job][r.System] = append(vals[r.Job][r.System], metric(r.Job, r))
	}
	out := map[string]map[string]float64{}
	for j, m := range vals {
		out[j] = map[string]float64{}
		for s, v := range m {
			out[j][s] = median(v)
		}
	}
	return out
}

// cpuMedians is the median server CPU per I/O by job and system.
func cpuMedians(rep report) map[string]map[string]float64 {
	return fieldMedians(rep, func(r Result) float64 { return r.CPUus })
}

// fieldMedians is the median of field over the repetitions, by job and
// system.
func fieldMedians(rep report, field func(Result) float64) map[string]map[string]float64 {
	vals := map[string]map[string][]float64{}
	for _, r := range rep.Results {
		if vals[r.Job] == nil {
			vals[r.Job] = map[string][]float64{}
		}
		vals[r.Job][r.System] = append(vals[r.Job][r.System], field(r))
	}
	out := map[string]map[string]float64{}
	for j, m := range vals {
		out[j] = map[string]float64{}
		for s, v := range m {
			out[j][s] = median(v)
		}
	}
	return out
}

func latencyMedians(rep report, job string) map[string]map[string]float64 {
	vals := map[string]map[string][]float64{}
	for _, r := range rep.Results {
		if r.Job != job {
			continue
		}
		if vals[r.System] == nil {
			vals[r.System] = map[string][]float64{}
		}
		for p, v := range r.ClatUs {
			vals[r.System][p] = append(vals[r.System][p], v)
		}
	}
	out := map[string]map[string]float64{}
	for s, m := range vals {
		out[s] = map[string]float64{}
		for p, v := range m {
			out[s][p] = median(v)
		}
	}
	return out
}

var pctOrder = []string{"50", "90", "99", "99.9", "99.99"}

func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// interleaveText says in words how a run's options interleaved the
// systems.
func interleaveText(options string) string {
	if strings.Contains(options, "interleave=system") {
		return "systems interleaved (all jobs on A, then all on B, ..., then again)"
	}
	return "jobs interleaved (in each repetition every system ran each job in turn, the systems' order rotating from " +
		"one repetition to the next)"
}

func markdown(rep report, jobs []string, systems []system, micro, prof string) string {
	med := medians(rep)
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark results\n\nRun %s on %s (%d CPUs; load average %s at the start, %s at the end; %s). %s. "+
		"Every (system, job) ran %s, %s; the figure is the median.\n\n", rep.Started.Format("2006-01-02 15:04 UTC"),
		rep.Host, rep.CPUs, rep.Load[0], rep.Load[1], rep.CPUIdle, rep.Options, repsText(rep), interleaveText(rep.Options))
	for _, v := range rep.Versions {
		fmt.Fprintf(&b, "- %s\n", strings.SplitN(v, "\n", 2)[0])
	}
	b.WriteString("\n## Targets of the data path (issue 16)\n\nOurs is " + ours + " (rinit -> rtarget, memory store); " +
		"medians of the repetitions above. Rates are IOPS (4K) or MB/s (1M); CPU is rinit + rtarget (user + system) per I/O " +
		"against the peer's server processes.\n\n")
	b.WriteString(targetTable(rep))
	b.WriteString(baselineSection(rep, jobs))
	if t := idleTable(rep); t != "" {
		b.WriteString("\n" + t)
	}
	if micro != "" {
		b.WriteString("\n" + microTable(micro))
	}
	b.WriteString("\n## Medians\n\n| Job | unit |")
	for _, s := range systems {
		fmt.Fprintf(&b, " %s |", s.name)
	}
	b.WriteString(" memory/nbdkit-memory | memory/nbdkit-proxy | thin/nbd-server |\n|---|---|")
	for range systems {
		b.WriteString("---|")
	}
	b.WriteString("---|---|---|\n")
	for _, j := range jobs {
		fmt.Fprintf(&b, "| %s | %s |", j, unit(j))
		for _, s := range systems {
			fmt.Fprintf(&b, " %.0f |", med[j][s.name])
		}
		fmt.Fprintf(&b, " %s | %s | %s |\n", ratio(med[j]["rnic-memory"], med[j]["nbdkit-memory"]),
			ratio(med[j]["rnic-memory"], med[j]["nbdkit-proxy"]), ratio(med[j]["rnic-thin"], med[j]["nbd-server"]))
	}
	cpu := cpuMedians(rep)
	b.WriteString("\n## Server CPU per I/O (µs of user + system time, median)\n\n" +
		"CPU time of the system's server processes (for ours rinit + rtarget; nbdkit-proxy both nbdkit processes; " +
		"nbd-server its daemon and connection child) during the fio run, divided by the I/Os done at the measured " +
		"rate. fio's own CPU is not counted. On these shared 2-CPU machines this is steadier than IOPS, and it is what " +
		"an I/O costs the host.\n\n")
	jobTable(&b, jobs, systems, cpu, "%.1f")
	b.WriteString("\n## Host CPU left idle during the job (% of all CPUs, median)\n\n" +
		"The share of the host's CPU time (all CPUs, /proc/stat) that was idle while fio ran, fio and the servers " +
		"together. Where ours leaves more idle than a peer while fio waits, it is bound by its latency (wake-ups and " +
		"hand-offs between the three processes), not by the CPU it uses.\n\n")
	b.WriteString(hostIdleTable(rep, jobs, systems))
	lat := latencyMedians(rep, "latency-4k-qd1")
	if len(lat) > 0 {
		b.WriteString("\n## Latency, 4K random read at QD1 (total latency, submission to completion, µs, median of runs)\n\n| System |")
		for _, p := range pctOrder {
			fmt.Fprintf(&b, " p%s |", p)
		}
		b.WriteString("\n|---|")
		for range pctOrder {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, s := range systems {
			fmt.Fprintf(&b, "| %s |", s.name)
			for _, p := range pctOrder {
				fmt.Fprintf(&b, " %.1f |", lat[s.name][p])
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n## Peak RSS of our processes (VmHWM, MiB, max over repetitions)\n\n| System | process | peak |\n|---|---|---|\n")
	peak := map[string]int64{}
	var keys []string
	for _, r := range rep.RSS {
		k := r.System + "|" + r.Proc
		if _, ok := peak[k]; !ok {
			keys = append(keys, k)
		}
		peak[k] = max(peak[k], r.PeakKB)
	}
	for _, k := range keys {
		f := strings.SplitN(k, "|", 2)
		fmt.Fprintf(&b, "| %s | %s | %.0f |\n", f[0], f[1], float64(peak[k])/1024)
	}
	b.WriteString("\n![IOPS](iops.png)\n\n![Latency](latency.png)\n")
	if prof != "" {
		b.WriteString("\n## CPU profile under randread-4k-qd16 (rnic-memory)\n\n" + prof)
	}
	if micro != "" {
		b.WriteString("\n## Go micro-benchmarks\n\nFull output in micro.txt. Selected lines:\n\n```\n")
		for _, l := range strings.Split(micro, "\n") {
			if strings.HasPrefix(l, "Benchmark") {
				b.WriteString(l + "\n")
			}
		}
		b.WriteString("```\n")
	}
	return b.String()
}

// hostIdleTable is the table of the host's idle CPU share by job and
// system (medians of Result.HostIdle).
func hostIdleTable(rep report, jobs []string, systems []system) string {
	var b strings.Builder
	jobTable(&b, jobs, systems, fieldMedians(rep, func(r Result) float64 { return r.HostIdle }), "%.0f")
	return b.String()
}

// jobTable writes a table of vals (by job and system), a row per job and a
// column per system, each value printed with format; "-" where a system
// has no value for a job (it did not run it, or failed).
func jobTable(b *strings.Builder, jobs []string, systems []system, vals map[string]map[string]float64, format string) {
	b.WriteString("| Job |")
	for _, s := range systems {
		fmt.Fprintf(b, " %s |", s.name)
	}
	b.WriteString("\n|---|")
	for range systems {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, j := range jobs {
		fmt.Fprintf(b, "| %s |", j)
		for _, s := range systems {
			if v, ok := vals[j][s.name]; ok {
				fmt.Fprintf(b, " "+format+" |", v)
			} else {
				b.WriteString(" - |")
			}
		}
		b.WriteString("\n")
	}
}

func repsText(rep report) string {
	n := 0
	for _, r := range rep.Results {
		n = max(n, r.Rep)
	}
	if n == 1 {
		return "once"
	}
	return strconv.Itoa(n) + " times"
}

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff},
}

// plots writes iops.png (median IOPS of every 4K job per system) and
// latency.png (QD1 read latency percentiles per system).
func plots(rep report, jobs []string, systems []system, out string) error {
	med := medians(rep)
	var iopsJobs []string
	for _, j := range jobs {
		if unit(j) == "IOPS" && !strings.HasPrefix(j, "latency") {
			iopsJobs = append(iopsJobs, j)
		}
	}
	p := plot.New()
	p.Title.Text = "4 KiB jobs: median IOPS (fio nbd engine, loopback)"
	p.Y.Label.Text = "IOPS"
	w := vg.Points(7)
	for i, s := range systems {
		vals := make(plotter.Values, len(iopsJobs))
		for k, j := range iopsJobs {
			vals[k] = med[j][s.name]
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(len(systems)-1)/2)
		p.Add(bars)
		p.Legend.Add(s.name, bars)
	}
	p.Legend.Top = true
	p.NominalX(iopsJobs...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -0.9
	if err := p.Save(28*vg.Centimeter, 14*vg.Centimeter, filepath.Join(out, "iops.png")); err != nil {
		return err
	}

	lat := latencyMedians(rep, "latency-4k-qd1")
	lp := plot.New()
	lp.Title.Text = "4 KiB random read, QD1: latency percentiles (submission to completion)"
	lp.Y.Label.Text = "µs"
	for i, s := range systems {
		vals := make(plotter.Values, len(pctOrder))
		for k, pc := range pctOrder {
			vals[k] = lat[s.name][pc]
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(len(systems)-1)/2)
		lp.Add(bars)
		lp.Legend.Add(s.name, bars)
	}
	lp.Legend.Top = true
	lp.Legend.Left = true
	var names []string
	for _, pc := range pctOrder {
		names = append(names, "p"+pc)
	}
	lp.NominalX(names...)
	return lp.Save(20*vg.Centimeter, 12*vg.Centimeter, filepath.Join(out, "latency.png"))
}
