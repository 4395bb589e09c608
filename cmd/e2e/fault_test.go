package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Fault kinds the proxy applies to a connection.
const (
	faultPass  = iota // forward the planned bytes unharmed
	faultReset        // after n bytes: RST both ways (SO_LINGER 0, close)
	faultStall        // after n bytes: forward nothing for 0.2-2 s, then go on
	faultHalf         // after n bytes: half-close (FIN) the direction that hit n
	faultClose        // after n bytes: close both ways (FIN)
	faultKinds
)

var faultNames = [faultKinds]string{"pass", "reset", "stall", "half-close", "close"}

// faultProxy forwards loopback TCP connections to a target and, while
// armed, injects one seeded fault per connection after a random number of
// bytes.
type faultProxy struct {
	t      *testing.T
	ln     net.Listener
	target string
	armed  atomic.Bool

	mu  sync.Mutex
	rng *rand.Rand

	conns  atomic.Int64
	counts [faultKinds]atomic.Int64 // faults applied ("pass": windows passed unharmed)
	wg     sync.WaitGroup
}

func newFaultProxy(t *testing.T, target string, seed uint64) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &faultProxy{t: t, ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, 0xfa017))}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c.(*net.TCPConn))
		}()
	}
}

// plan is the next fault of a connection: once after bytes went through
// in direction dir (0: initiator to target, 1: back), kind happens; a pass
// or a stall is followed by a fresh plan, so a long-lived connection
// meets fault after fault while the proxy is armed.
type plan struct {
	kind  int
	dir   int
	after int64
	stall time.Duration
}

func (p *faultProxy) plan() plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	// pass twice as likely as each fault.
	pl := plan{kind: max(0, p.rng.IntN(faultKinds+1)-1), dir: p.rng.IntN(2)}
	// Log-uniform from 16 B (mid-login) to 4 MiB (mid-transfer).
	pl.after = int64(16 << p.rng.IntN(18))
	pl.after += p.rng.Int64N(pl.after)
	pl.stall = 200*time.Millisecond + time.Duration(p.rng.Int64N(int64(1800*time.Millisecond)))
	return pl
}

// pconn is one proxied connection: the two legs and the fault plan both
// directions share.
type pconn struct {
	p    *faultProxy
	legs [2]*net.TCPConn

	mu         sync.Mutex
	planned    bool
	pl         plan
	n          int64 // bytes forwarded in pl.dir since pl was drawn
	stallUntil time.Time
}

// next returns how much of want bytes in direction dir may go before the
// plan's fault, and whether the fault comes right after them.
func (c *pconn) next(dir, want int) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.planned && c.p.armed.Load() {
		c.pl, c.n, c.planned = c.p.plan(), 0, true
	}
	if !c.planned || dir != c.pl.dir || c.n+int64(want) < c.pl.after {
		return want, false
	}
	// Bytes counted by sent for a write that began before this plan was
	// drawn (by the other direction) can carry n past the fault point:
	// then the fault comes now.
	return int(max(c.pl.after-c.n, 0)), true
}

// sent records k bytes forwarded in dir; if hit, it returns the fault to
// apply now (faultPass: none) and draws the next plan later.
func (c *pconn) sent(dir, k int, hit bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.planned || dir != c.pl.dir {
		return faultPass
	}
	c.n += int64(k)
	if !hit {
		return faultPass
	}
	c.planned = false
	if !c.p.armed.Load() {
		return faultPass
	}
	c.p.counts[c.pl.kind].Add(1)
	if c.pl.kind == faultStall {
		c.stallUntil = time.Now().Add(c.pl.stall)
	}
	return c.pl.kind
}

func (c *pconn) stalled() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Until(c.stallUntil)
}

func (p *faultProxy) serve(in *net.TCPConn) {
	defer in.Close()
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	p.conns.Add(1)
	c := &pconn{p: p, legs: [2]*net.TCPConn{in, out.(*net.TCPConn)}}
	var wg sync.WaitGroup
	for dir := 0; dir < 2; dir++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.pump(dir)
		}()
	}
	wg.Wait()
}

// pump forwards direction dir, applying the faults the plan calls for.
func (c *pconn) pump(dir int) {
	src, dst := c.legs[dir], c.legs[1-dir]
	buf := make([]byte, 32<<10)
	for {
		k, rerr := src.Read(buf)
		b := buf[:k]
		for len(b) > 0 {
			if d := c.stalled(); d > 0 {
				time.Sleep(d)
			}
			m, hit := c.next(dir, len(b))
			if _, err := dst.Write(b[:m]); err != nil {
				src.Close()
				return
			}
			b = b[m:]
			switch c.sent(dir, m, hit) {
			case faultReset:
				for _, l := range c.legs {
					l.SetLinger(0)
					l.Close()
				}
				return
			case faultHalf:
				dst.CloseWrite()
				src.CloseRead()
				return
			case faultClose:
				for _, l := range c.legs {
					l.Close()
				}
				return
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				dst.CloseWrite()
			} else {
				dst.Close()
			}
			return
		}
	}
}

func (p *faultProxy) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d connections seen; faults injected:", p.conns.Load())
	for k := faultReset; k < faultKinds; k++ {
		fmt.Fprintf(&b, " %s=%d", faultNames[k], p.counts[k].Load())
	}
	fmt.Fprintf(&b, "; byte windows passed unharmed: %d", p.counts[faultPass].Load())
	return b.String()
}

// fioResult is what fio's JSON report says of a job.
type fioResult struct {
	Error int `json:"error"`
	Read  struct {
		IOBytes int64 `json:"io_bytes"`
	} `json:"read"`
	Write struct {
		IOBytes int64 `json:"io_bytes"`
	} `json:"write"`
}

func runFio(ctx context.Context, uri string, args ...string) (fioResult, string, error) {
	base := []string{"--ioengine=nbd", "--uri=" + uri, "--bs=4k", "--iodepth=16", "--verify=crc32c", "--do_verify=1",
		"--verify_state_save=0", "--verify_fatal=1", "--output-format=json"}
	// A hang guard, not a performance bound: a 4 MiB job takes seconds
	// even when every connection fails.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", append(base, args...)...)
	// fio runs its job in a forked process: kill the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	s := string(out)
	if err != nil {
		return fioResult{}, s, fmt.Errorf("fio %s: %w", strings.Join(args, " "), err)
	}
	if i := strings.IndexByte(s, '{'); i > 0 {
		s = s[i:]
	}
	var r struct {
		Jobs []fioResult `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(s), &r); err != nil || len(r.Jobs) != 1 {
		return fioResult{}, string(out), fmt.Errorf("fio output (%d jobs): %v", len(r.Jobs), err)
	}
	return r.Jobs[0], string(out), nil
}

// missingFaults lists the fault kinds the proxy has not injected yet.
func (p *faultProxy) missingFaults() []string {
	var miss []string
	for k := faultReset; k < faultKinds; k++ {
		if p.counts[k].Load() == 0 {
			miss = append(miss, faultNames[k])
		}
	}
	return miss
}

// TestFaultProxy puts a fault-injecting TCP proxy between rinit and
// rtarget: connections are reset, stalled, half-closed or closed after a
// random number of bytes, mid-login or mid-transfer. fio writes and
// verifies through rinit's NBD export meanwhile; rinit reconnects and
// replays, and every verify passes. Every fault kind must actually have
// been injected: if one has not by the end of the duration, jobs go on
// (up to twice the duration, at least a minute, more) until it has, and
// the test fails if it still has not. RNIC_FAULT_DURATION (default 15s)
// and RNIC_FAULT_SEED.
func TestFaultProxy(t *testing.T) {
	needTools(t, "fio")
	dur := 15 * time.Second
	if v := os.Getenv("RNIC_FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RNIC_FAULT_DURATION=%q: %v", v, err)
		}
		dur = d
	}
	seed := envSeed(t, "RNIC_FAULT_SEED")
	t.Logf("RNIC_FAULT_SEED=%d duration=%s", seed, dur)

	rt, ri := bins(t)
	targetAddr, nbdAddr := freePort(t), freePort(t)
	target := start(t, rt, "serve", "--data", t.TempDir(), "--listen", targetAddr, "--volume", "vol:256M")
	waitPort(t, targetAddr, target)
	px := newFaultProxy(t, targetAddr, seed)
	rinit := start(t, ri, "nbd", "--target", px.addr(), "--volume", "vol", "--listen", nbdAddr, "--name", "faulty")
	// Faults begin once the session is up: a login cut at rinit's start
	// ends rinit, rightly (connect fails, and says why).
	waitOutput(t, rinit, "serving NBD")
	uri := "nbd://" + nbdAddr + "/vol"

	// Jobs go on past dur (up to extra more) while a fault kind is missing.
	extra := max(dur, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), dur+extra+3*time.Minute)
	defer cancel()
	px.armed.Store(true)
	began := time.Now()
	var jobs int
	var written, read int64
	more := func() bool {
		el := time.Since(began)
		return el < dur || el < dur+extra && len(px.missingFaults()) > 0
	}
	for i := 0; more(); i++ {
		// Each job has its own 4 MiB stretch, so a verify only ever
		// reads what that job wrote.
		args := []string{fmt.Sprintf("--name=fault%d", i), "--size=4M", fmt.Sprintf("--offset=%dM", (i%48)*4),
			fmt.Sprintf("--randseed=%d", seed+uint64(i))}
		if i%2 == 0 {
			args = append(args, "--rw=randwrite")
		} else {
			args = append(args, "--rw=randrw")
		}
		r, out, err := runFio(ctx, uri, args...)
		if err != nil || r.Error != 0 {
			t.Logf("proxy: %s", px.summary())
			dumpStacks(rinit)
			t.Fatalf("job %d after %s: error=%d %v\n%s", i, time.Since(began).Round(time.Millisecond), r.Error, err, fioErrors(out))
		}
		jobs++
		written += r.Write.IOBytes
		read += r.Read.IOBytes
	}
	px.armed.Store(false)
	t.Logf("faults for %s: %s", time.Since(began).Round(time.Millisecond), px.summary())
	t.Logf("%d fio jobs verified with error=0: %d MiB written, %d MiB read", jobs, written>>20, read>>20)
	if miss := px.missingFaults(); len(miss) > 0 {
		t.Fatalf("fault kinds never injected in %s (seed %d): %s", time.Since(began).Round(time.Millisecond), seed,
			strings.Join(miss, ", "))
	}

	// Clean connections from now on: a last verified job, and rinit
	// is still serving.
	if r, out, err := runFio(ctx, uri, "--name=after", "--size=4M", "--offset=200M", "--rw=randwrite"); err != nil || r.Error != 0 {
		dumpStacks(rinit)
		t.Fatalf("after the faults: error=%d %v\n%s", r.Error, err, fioErrors(out))
	}
	select {
	case err := <-rinit.done:
		rinit.done <- err
		t.Fatalf("rinit exited: %v\n%s", err, rinit.output())
	default:
	}
}

// fioErrors is fio's output without its JSON report (which follows the
// messages fio prints about failed I/O and verification).
func fioErrors(out string) string {
	if i := strings.Index(out, "{\n  \"fio version\""); i >= 0 {
		return out[:i] + "[JSON report omitted]"
	}
	return out
}

// dumpStacks makes a Go process print its goroutines (SIGQUIT) into its
// captured output, for a hang's diagnosis.
func dumpStacks(p *proc) {
	p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
	}
}
