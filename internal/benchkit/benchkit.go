// Package benchkit is the plumbing the benchmark commands of bench/ share:
// fio runs with its nbd engine, processes with their logs, ports, CPU
// time and medians.
package benchkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/internal/childproc"
)

// Rate is what a fio job did: IOPS and MB/s, reads and writes together.
type Rate struct {
	IOPS, MBps float64
}

// FioJob is the first job of a fio run's JSON report.
type FioJob struct {
	Error int    `json:"error"`
	Read  FioDir `json:"read"`
	Write FioDir `json:"write"`
}

// FioDir is one direction of a FioJob.
type FioDir struct {
	IOPS    float64 `json:"iops"`
	BwBytes int64   `json:"bw_bytes"`
	Clat    struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
	Lat struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"lat_ns"`
}

// RunFio runs a fio job file with the given environment (NBD_URI, REGION,
// RUNTIME, RAMP and what the job names) and returns its report; a job
// that reports an error fails, with the report.
func RunFio(ctx context.Context, job string, env ...string) (FioJob, error) {
	cmd := exec.CommandContext(ctx, "fio", "--output-format=json", job)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return FioJob{}, fmt.Errorf("fio %s: %w\n%s", job, err, ee.Stderr)
		}
		return FioJob{}, fmt.Errorf("fio %s: %w", job, err)
	}
	// fio may print warnings before the JSON document.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var doc struct {
		Jobs []FioJob `json:"jobs"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return FioJob{}, fmt.Errorf("fio %s: parse JSON: %w", job, err)
	}
	if len(doc.Jobs) == 0 {
		return FioJob{}, fmt.Errorf("fio %s: no jobs in output", job)
	}
	j := doc.Jobs[0]
	if j.Error != 0 {
		return j, fmt.Errorf("fio %s: job error %d", job, j.Error)
	}
	return j, nil
}

// Fio runs a fio job file as RunFio does and returns its rate.
func Fio(ctx context.Context, job string, env ...string) (Rate, error) {
	j, err := RunFio(ctx, job, env...)
	if err != nil {
		return Rate{}, err
	}
	return Rate{IOPS: j.Read.IOPS + j.Write.IOPS, MBps: float64(j.Read.BwBytes+j.Write.BwBytes) / 1e6}, nil
}

// StartProc starts c with its output appended to logFile.
func StartProc(c *exec.Cmd, logFile string) error {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	c.Stdout, c.Stderr = f, f
	childproc.DieWithParent(c, syscall.SIGTERM)
	return c.Start()
}

// StopProc interrupts c and waits for it, killing it after timeout.
func StopProc(c *exec.Cmd, timeout time.Duration) {
	if c == nil || c.Process == nil {
		return
	}
	c.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		c.Process.Kill()
		<-done
	}
}

// FreePort returns a TCP port free on 127.0.0.1 now.
func FreePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// WaitPort waits up to 30 s for something to listen on port of 127.0.0.1.
func WaitPort(port string) error {
	for range 300 {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %s after 30 s", port)
}

// CPU is the CPU time (user + system) the processes used so far.
func CPU(procs ...*exec.Cmd) time.Duration {
	var t time.Duration
	for _, p := range procs {
		if p == nil || p.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		if err != nil {
			continue
		}
		// The fields after the command, which may hold spaces.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		t += time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return t
}

// Median returns the median of v (NaN if empty).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
