package main

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The targets of the data path (issue 16), each a ratio of medians from
// one run: ours (rinit -> rtarget, memory store, default flags) against
// nbdkit memory (one hop) and against the nbdkit nbd plugin proxying to
// nbdkit memory (the same two hops built from stock parts).

const (
	ours      = "rnic-memory"
	oneHop    = "nbdkit-memory"
	twoHops   = "nbdkit-proxy"
	qd1Job    = "latency-4k-qd1" // 4K random read at QD1, with total latency percentiles
	microPkg  = "./rnic"
	microRead = "BenchmarkRead4K"
	microTCP  = "BenchmarkTCPPingPong4K"
)

// quickJobs and quickSystems are what -quick runs: the jobs and peers the
// targets name.
var (
	quickJobs    = []string{qd1Job, "randread-4k-qd16", "randwrite-4k-qd16", "seqread-1m", "seqwrite-1m"}
	quickSystems = []string{ours, oneHop, twoHops}
)

// target is one goal: ours/peer of a metric, at least (or, for costs and
// latencies, at most) goal.
type target struct {
	what   string
	job    string
	peer   string
	metric string // "rate" (IOPS or MB/s), "p50" (µs), "cpu" (µs per I/O)
	goal   float64
	atMost bool
}

var targets = []target{
	{"4K randread QD1", qd1Job, twoHops, "rate", 1.5, false},
	{"4K randread QD1 p50 latency", qd1Job, twoHops, "p50", 0.67, true},
	{"4K randread QD16", "randread-4k-qd16", twoHops, "rate", 2, false},
	{"4K randwrite QD16", "randwrite-4k-qd16", twoHops, "rate", 2, false},
	{"1M seq read", "seqread-1m", twoHops, "rate", 1.5, false},
	{"1M seq write", "seqwrite-1m", twoHops, "rate", 1.5, false},
	{"4K randread QD16", "randread-4k-qd16", oneHop, "rate", 0.7, false},
	{"4K randwrite QD16", "randwrite-4k-qd16", oneHop, "rate", 0.7, false},
	{"1M seq read", "seqread-1m", oneHop, "rate", 0.7, false},
	{"1M seq write", "seqwrite-1m", oneHop, "rate", 0.7, false},
	{"4K randread QD1 p50 latency", qd1Job, oneHop, "p50", 2, true},
	{"CPU per I/O, 4K randread QD16", "randread-4k-qd16", oneHop, "cpu", 1.5, true},
	{"CPU per I/O, 4K randwrite QD16", "randwrite-4k-qd16", oneHop, "cpu", 1.5, true},
	{"CPU per I/O, 4K randread QD1", qd1Job, oneHop, "cpu", 2.5, true},
}

// value is what target t measures in one run.
func (t target) value(r Result) float64 {
	switch t.metric {
	case "p50":
		return r.ClatUs["50"]
	case "cpu":
		return r.CPUus
	}
	return metric(t.job, r)
}

// repRatios are ours/peer of t within each repetition that ran both, in
// repetition order.
func repRatios(rep report, t target) []float64 {
	o, p := map[int]float64{}, map[int]float64{}
	for _, r := range rep.Results {
		if r.Job != t.job {
			continue
		}
		switch r.System {
		case ours:
			o[r.Rep] = t.value(r)
		case t.peer:
			p[r.Rep] = t.value(r)
		}
	}
	var reps []int
	for k := range o {
		reps = append(reps, k)
	}
	sort.Ints(reps)
	var out []float64
	for _, k := range reps {
		if o[k] > 0 && p[k] > 0 {
			out = append(out, o[k]/p[k])
		}
	}
	return out
}

// targetTable renders the targets as a markdown table from the medians of
// rep, with the range of the ratios within single repetitions (how much
// the host moved them); targets whose job or systems did not run are left
// out.
func targetTable(rep report) string {
	med, cpu, lat := medians(rep), cpuMedians(rep), latencyMedians(rep, qd1Job)
	var b strings.Builder
	b.WriteString("| Target | vs | Ours | Peer | Ratio | Per repetition | Goal | Met |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range targets {
		var o, p float64
		var u string
		switch t.metric {
		case "rate":
			o, p, u = med[t.job][ours], med[t.job][t.peer], unit(t.job)
		case "p50":
			o, p, u = lat[ours]["50"], lat[t.peer]["50"], "µs"
		case "cpu":
			o, p, u = cpu[t.job][ours], cpu[t.job][t.peer], "µs"
		}
		if o == 0 || p == 0 {
			continue
		}
		r := o / p
		met := r >= t.goal
		cmp := ">="
		if t.atMost {
			met, cmp = r <= t.goal, "<="
		}
		var per []string
		for _, x := range repRatios(rep, t) {
			per = append(per, strconv.FormatFloat(x, 'f', 2, 64))
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s %s | %.2fx | %s | %s %.2gx | %s |\n", t.what, t.peer, num(o), u, num(p), u, r,
			strings.Join(per, ", "), cmp, t.goal, yesNo(met))
	}
	return b.String()
}

func num(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

// idleTable renders the CPU our processes used while logged in and idle.
func idleTable(rep report) string {
	by := map[string][]float64{}
	var names []string
	for _, r := range rep.Idle {
		if _, ok := by[r.System]; !ok {
			names = append(names, r.System)
		}
		by[r.System] = append(by[r.System], r.CPUPercent)
	}
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| System | idle CPU (rinit + rtarget, % of one CPU, median) | Goal |\n|---|---|---|\n")
	for _, n := range names {
		fmt.Fprintf(&b, "| %s | %.2f %% | about 0 |\n", n, median(by[n]))
	}
	return b.String()
}

// benchLine matches a `go test -bench` result line.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op`)

// microMedians parses benchmark output into median ns/op by name.
func microMedians(out string) map[string]float64 {
	vals := map[string][]float64{}
	for _, l := range strings.Split(out, "\n") {
		m := benchLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err == nil {
			vals[m[1]] = append(vals[m[1]], v)
		}
	}
	med := map[string]float64{}
	for k, v := range vals {
		med[k] = median(v)
	}
	return med
}

// microTable renders the engine micro-benchmark pairs (ours vs raw Go TCP
// in the same run).
func microTable(out string) string {
	if out == "" {
		return "" // not run (-micro=false)
	}
	med := microMedians(out)
	var b strings.Builder
	b.WriteString("| Engine benchmark | ns/op | raw TCP peer | ns/op | Ratio | Goal |\n|---|---|---|---|---|---|\n")
	for _, p := range []struct{ ours, peer, goal string }{
		{microRead, microTCP, "<= 1.1x"},
		{"BenchmarkWriteStream", "BenchmarkTCPStream", "not slower than before"},
		{"BenchmarkTCPSendmsg/zerocopy", "BenchmarkTCPSendmsg/copy", "(MSG_ZEROCOPY: used only if < 1x)"},
	} {
		o, q := med[p.ours], med[p.peer]
		if o == 0 || q == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %.0f | %.2fx | %s |\n", p.ours, o, p.peer, q, o/q, p.goal)
	}
	var rest []string
	for k := range med {
		if k == "BenchmarkSendRecv" || k == "BenchmarkFetchAdd" {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		fmt.Fprintf(&b, "| %s | %.0f | | | | not slower than before |\n", k, med[k])
	}
	return b.String()
}

// baselineTable renders ours against the baseline (-baseline) job by job:
// the ratio of the medians of the rate and of the CPU per I/O, with each
// repetition's own ratio (both ran in it, minutes apart at most). Empty
// without a baseline.
func baselineTable(rep report, jobs []string) string {
	if rep.Baseline == "" {
		return ""
	}
	base := baselineName(rep.Baseline)
	med, cpu := medians(rep), cpuMedians(rep)
	var b strings.Builder
	fmt.Fprintf(&b, "| Job | %s | %s | Ratio | Per repetition | CPU per I/O | at %s | Ratio | Per repetition |\n"+
		"|---|---|---|---|---|---|---|---|---|\n", ours, base, rep.Baseline)
	for _, j := range jobs {
		o, p := med[j][ours], med[j][base]
		if o == 0 || p == 0 {
			continue
		}
		rate := target{job: j, peer: base, metric: "rate"}
		cost := target{job: j, peer: base, metric: "cpu"}
		fmt.Fprintf(&b, "| %s | %s %s | %s %s | %.2fx | %s | %s µs | %s µs | %s | %s |\n", j, num(o), unit(j), num(p), unit(j), o/p,
			ratioList(repRatios(rep, rate)), num(cpu[j][ours]), num(cpu[j][base]), ratio(cpu[j][ours], cpu[j][base]),
			ratioList(repRatios(rep, cost)))
	}
	return b.String()
}

// baselineSection is baselineTable with its heading, or empty.
func baselineSection(rep report, jobs []string) string {
	t := baselineTable(rep, jobs)
	if t == "" {
		return ""
	}
	return "\n## Against the baseline\n\n" + ours + " against the same stack built from " + rep.Baseline +
		" (-baseline), interleaved in the same repetitions; above 1x the rate is higher, below 1x the CPU per I/O lower.\n\n" + t + "\n"
}

func ratioList(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatFloat(x, 'f', 2, 64))
	}
	return strings.Join(s, ", ")
}
