package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestJobTable(t *testing.T) {
	rep := report{Results: []Result{
		{System: "a", Job: "j1", HostIdle: 10},
		{System: "a", Job: "j1", HostIdle: 30},
		{System: "a", Job: "j1", HostIdle: 20},
		{System: "b", Job: "j1", HostIdle: 5},
		{System: "b", Job: "j2", HostIdle: 7.6},
	}}
	got := hostIdleTable(rep, []string{"j1", "j2"}, []system{{name: "a"}, {name: "b"}})
	want := "| Job | a | b |\n|---|---|---|\n| j1 | 20 | 5 |\n| j2 | - | 8 |\n"
	if got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

// TestHostTicks reads the host's CPU time twice around some work of its
// own: the total grows, and the busy part grows by at least part of the
// work (other CPUs may idle meanwhile).
func TestHostTicks(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	busy0, idle0 := hostTicks()
	if busy0 <= 0 || idle0 < 0 {
		t.Fatalf("hostTicks: busy %d, idle %d", busy0, idle0)
	}
	x := 0
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for i := range 1000 {
			x += i
		}
	}
	busy1, idle1 := hostTicks()
	if busy1 <= busy0 || idle1 < idle0 {
		t.Fatalf("hostTicks went from busy %d idle %d to busy %d idle %d (work %d)", busy0, idle0, busy1, idle1, x)
	}
}

// TestCPUIdle checks the description of the host's idle policy against
// sysfs: the driver it names is the one there, and under haltpoll the
// poll time is given.
func TestCPUIdle(t *testing.T) {
	got := cpuIdle()
	b, err := os.ReadFile("/sys/devices/system/cpu/cpuidle/current_driver")
	if err != nil {
		if got != "cpuidle driver unknown" {
			t.Fatalf("no cpuidle in sysfs (%v), got %q", err, got)
		}
		return
	}
	d := strings.TrimSpace(string(b))
	if !strings.HasPrefix(got, "cpuidle driver "+d+", governor ") {
		t.Fatalf("got %q, driver %q", got, d)
	}
	if d == "haltpoll" && !strings.Contains(got, "guest_halt_poll_ns ") {
		t.Fatalf("haltpoll without its poll time: %q", got)
	}
}

// TestTargetTableRepRatios: a target's row gives the ratio of the medians
// and, in repetition order, ours/peer within each repetition; a
// repetition the peer did not run gives no ratio.
func TestTargetTableRepRatios(t *testing.T) {
	job := "randread-4k-qd16"
	rep := report{Results: []Result{
		{System: ours, Job: job, Rep: 2, ReadIOPS: 300, CPUus: 10},
		{System: twoHops, Job: job, Rep: 2, ReadIOPS: 100, CPUus: 20},
		{System: ours, Job: job, Rep: 1, ReadIOPS: 200, CPUus: 12},
		{System: twoHops, Job: job, Rep: 1, ReadIOPS: 200, CPUus: 24},
		{System: ours, Job: job, Rep: 3, ReadIOPS: 250, CPUus: 11},
	}}
	got := targetTable(rep)
	want := "| 4K randread QD16 | nbdkit-proxy | 250 IOPS | 150 IOPS | 1.67x | 1.00, 3.00 | >= 2x | **no** |\n"
	if !strings.Contains(got, want) {
		t.Fatalf("table:\n%s\nwant the row:\n%s", got, want)
	}
	if strings.Contains(got, nbdkitMemoryRow) {
		t.Fatalf("a row for a peer that did not run:\n%s", got)
	}
}

const nbdkitMemoryRow = "| nbdkit-memory |"

// TestBaselineTable: ours against the baseline, job by job, from the
// medians, with each repetition's ratio; no table without a baseline and
// no row for a job the baseline did not run.
func TestBaselineTable(t *testing.T) {
	base := baselineName("abc123")
	rep := report{Baseline: "abc123", Results: []Result{
		{System: ours, Job: "randread-4k-qd16", Rep: 1, ReadIOPS: 110, CPUus: 9},
		{System: base, Job: "randread-4k-qd16", Rep: 1, ReadIOPS: 100, CPUus: 10},
		{System: ours, Job: "randread-4k-qd16", Rep: 2, ReadIOPS: 90, CPUus: 11},
		{System: base, Job: "randread-4k-qd16", Rep: 2, ReadIOPS: 100, CPUus: 10},
		{System: ours, Job: "seqread-1m", Rep: 1, ReadMBps: 1000, CPUus: 500},
	}}
	got := baselineTable(rep, []string{"randread-4k-qd16", "seqread-1m"})
	want := "| randread-4k-qd16 | 100 IOPS | 100 IOPS | 1.00x | 1.10, 0.90 | 10.0 µs | 10.0 µs | 1.00x | 0.90, 1.10 |\n"
	if !strings.Contains(got, want) {
		t.Fatalf("table:\n%s\nwant the row:\n%s", got, want)
	}
	if strings.Contains(got, "seqread-1m") {
		t.Fatalf("a row for a job the baseline did not run:\n%s", got)
	}
	rep.Baseline = ""
	if got := baselineSection(rep, []string{"randread-4k-qd16"}); got != "" {
		t.Fatalf("a baseline section without a baseline:\n%s", got)
	}
}
