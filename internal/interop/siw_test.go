package interop

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/childproc"
	"github.com/rnic-dev/rnic/internal/linuxvm"
	"github.com/rnic-dev/rnic/internal/perftest"
	"github.com/rnic-dev/rnic/internal/rping"
	"github.com/rnic-dev/rnic/rnic"
)

const (
	pings    = 100
	pingSize = 4096
)

// guestScript runs, in order: Linux rping -c against our server on the
// host; Linux rping -s, which our client on the host pings through the
// forward; ib_write_bw, ib_read_bw and ib_send_bw -R against our perftest
// servers on the host. Lines starting "CHECK " are asserted on. perftest
// gets -F: under emulation its cycle-counter calibration sometimes fails
// ("Correlation coefficient r^2 < 0.9, Can't produce a report", exit 1)
// after a complete run, and -F makes that a warning.
const guestScript = `
set -u
waitlisten() { local w=0; while ! netstat -ltn 2>/dev/null | grep -q ":$1 "; do
  w=$((w+1)); [ $w -gt 300 ] && return 1; sleep 0.1; done; }

timeout 300 rping -c -a 10.0.2.2 -p {{HOST_RPING}} -C {{PINGS}} -S {{SIZE}} -v -V >/tmp/rc 2>&1
echo "CHECK linux-rping-client rc=$?"
echo "CHECK linux-rping-client pings=$(grep -c 'ping data: rdma-ping-' /tmp/rc)"
grep -v 'ping data' /tmp/rc | head -20

rping -s {{SERVER_OPTS}} -a 10.0.2.15 -p {{GUEST_RPING}} -S {{SIZE}} -v >/tmp/rs 2>&1 &
SPID=$!
waitlisten {{GUEST_RPING}} && echo "READY linux-rping-server"
wait $SPID; echo "CHECK linux-rping-server rc=$?"
echo "CHECK linux-rping-server pings=$(grep -c 'server ping data: rdma-ping-' /tmp/rs)"
grep -v 'ping data' /tmp/rs | head -20

for t in write read send; do
  case $t in write) P={{PW}};; read) P={{PR}};; send) P={{PS}};; esac
  timeout 300 ib_${t}_bw -R -F -n 200 -s 4096 -p $P 10.0.2.2 >/tmp/p 2>&1
  rc=$?
  echo "CHECK ib_${t}_bw rc=$rc"
  if [ $rc = 0 ]; then sed "s/^/ib_${t}_bw: /" /tmp/p | tail -4; else sed "s/^/ib_${t}_bw: /" /tmp/p; dmesg | tail -20; fi
done
`

func TestSiw(t *testing.T) {
	cache := linuxvm.TestCache(t)
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Fatalf("tshark not installed (apt-get install tshark; .ci/deps does): %v", err)
	}
	for _, v := range []linuxvm.Variant{linuxvm.Stock, linuxvm.CRC1} {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			testSiw(t, cache, v)
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func openDev(t *testing.T, name string) *rnic.Device {
	t.Helper()
	cfg := rnic.DefaultConfig()
	cfg.Name = name
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t, name + ": "}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := rnic.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

type testWriter struct {
	t      *testing.T
	prefix string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s%s", w.prefix, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type result struct {
	name string
	err  error
	msg  string
}

func testSiw(t *testing.T, cache string, v linuxvm.Variant) {
	start := time.Now()
	hostRping, guestRping := freePort(t), freePort(t)
	pw, pr, ps := freePort(t), freePort(t), freePort(t)
	ports := []int{hostRping, guestRping, pw, pr, ps}
	capture := startCapture(t, ports)

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	crc := v == linuxvm.CRC1
	rev := 2
	if crc {
		rev = 1
	}
	results := make(chan result, 8)
	var wg sync.WaitGroup
	listen := func(name string, port int) (*rnic.Device, *rnic.Listener) {
		dev := openDev(t, name)
		ln, err := dev.Listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return dev, ln
	}

	// 1. Linux rping -c -> our rping server.
	dev, ln := listen("rping-server", hostRping)
	var serverOut bytes.Buffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		st, err := rping.Server(ctx, dev, ln, rping.Options{Size: pingSize, Count: pings, CRC: crc, Verbose: &serverOut}, true)
		msg := fmt.Sprintf("%d pings verified", st.Pings)
		if st.Conn != nil {
			msg += fmt.Sprintf(" (MPA rev %d, CRC %v, peer IRD/ORD %d/%d)", st.Conn.Rev, st.Conn.CRC, st.Conn.PeerIRD, st.Conn.PeerORD)
		}
		results <- result{"our rping server <- Linux rping -c", err, msg}
	}()
	// 4. Linux ib_*_bw -R -> our perftest servers.
	for _, p := range []struct {
		test perftest.Test
		port int
	}{{perftest.Write, pw}, {perftest.Read, pr}, {perftest.Send, ps}} {
		dev, ln := listen("perftest-"+string(p.test), p.port)
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := perftest.Serve(ctx, dev, ln, perftest.Options{Test: p.test, MaxSize: 65536})
			results <- result{fmt.Sprintf("our perftest server <- Linux ib_%s_bw -R", p.test), err,
				fmt.Sprintf("%d comm messages, data connection %v, %d sends received, %d credit writes", st.CommMessages, st.DataConn, st.Received, st.Credits)}
		}()
	}

	// A Linux rping server over MPA revision 1 needs -q (see README.md).
	serverOpts := ""
	if v == linuxvm.CRC1 {
		serverOpts = "-q"
	}
	script := strings.NewReplacer("{{HOST_RPING}}", itoa(hostRping), "{{GUEST_RPING}}", itoa(guestRping),
		"{{PW}}", itoa(pw), "{{PR}}", itoa(pr), "{{PS}}", itoa(ps), "{{PINGS}}", itoa(pings), "{{SIZE}}", itoa(pingSize),
		"{{SERVER_OPTS}}", serverOpts).Replace(guestScript)
	vm, err := linuxvm.Boot(ctx, linuxvm.Config{CacheDir: cache, Variant: v, GuestScript: script,
		Forwards: []int{guestRping}, Timeout: 11 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// 2. Our rping client -> Linux rping -s in the guest.
	if _, err := vm.WaitFor(ctx, "READY linux-rping-server"); err != nil {
		vm.Stop()
		res, _ := vm.Wait()
		logGuest(t, res)
		t.Fatalf("the guest's rping server never listened: %v", err)
	}
	var clientOut bytes.Buffer
	cdev := openDev(t, "rping-client")
	st, err := rping.Client(ctx, cdev, net.JoinHostPort("127.0.0.1", itoa(guestRping)),
		rping.Options{Size: pingSize, Count: pings, Rev: rev, CRC: crc, Verbose: &clientOut})
	msg := fmt.Sprintf("%d pings verified", st.Pings)
	if st.Conn != nil {
		msg += fmt.Sprintf(" (MPA rev %d, CRC %v, peer IRD/ORD %d/%d)", st.Conn.Rev, st.Conn.CRC, st.Conn.PeerIRD, st.Conn.PeerORD)
	}
	results <- result{"our rping client -> Linux rping -s", err, msg}

	res, err := vm.Wait()
	logGuest(t, res)
	if err != nil {
		t.Errorf("VM: %v", err)
	}
	cancel()
	wg.Wait()
	close(results)
	for r := range results {
		if r.err != nil {
			t.Errorf("%s: %v (%s)", r.name, r.err, r.msg)
		} else {
			t.Logf("PASS %s: %s", r.name, r.msg)
		}
	}
	if n := strings.Count(clientOut.String(), "ping data: rdma-ping-"); n != pings {
		t.Errorf("our client printed %d ping lines, want %d", n, pings)
	}
	if n := strings.Count(serverOut.String(), "server ping data: rdma-ping-"); n != pings {
		t.Errorf("our server printed %d ping lines, want %d", n, pings)
	}
	if res != nil {
		for _, want := range []string{
			"CHECK linux-rping-client rc=0", fmt.Sprintf("CHECK linux-rping-client pings=%d", pings),
			"CHECK linux-rping-server rc=0", fmt.Sprintf("CHECK linux-rping-server pings=%d", pings),
			"CHECK ib_write_bw rc=0", "CHECK ib_read_bw rc=0", "CHECK ib_send_bw rc=0",
		} {
			if !hasLine(res.Lines, want) {
				t.Errorf("guest output lacks %q", want)
			}
		}
	}
	// 5. The capture of all of it: 0 malformed frames, 0 bad CRCs.
	capture.stop(t)
	capture.check(t, crc)
	t.Logf("variant %s done in %v", v, time.Since(start).Round(time.Millisecond))
}

func itoa(i int) string { return strconv.Itoa(i) }

func hasLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func logGuest(t *testing.T, res *linuxvm.Result) {
	if res == nil {
		return
	}
	for _, l := range res.Lines {
		if strings.Contains(l, "ping data: rdma-ping-") && !strings.Contains(l, "rdma-ping-0:") && !strings.Contains(l, fmt.Sprintf("rdma-ping-%d:", pings-1)) {
			continue
		}
		if len(l) > 160 {
			l = l[:160] + "..."
		}
		t.Logf("guest: %s", l)
	}
}

// droppedRe finds tshark's report of the packets the kernel dropped
// because dumpcap did not read them in time ("N packets dropped from lo").
var droppedRe = regexp.MustCompile(`(\d+) packets? dropped from`)

// capture is tshark recording the host loopback for the test's ports.
type capture struct {
	path string
	cmd  *exec.Cmd
	errb bytes.Buffer
}

// keep copies the capture out of the test's temporary directory, which
// goes with the test, so that a failed check can be dissected afterwards;
// it returns where the copy is (or why there is none).
func (c *capture) keep(t *testing.T) string {
	b, err := os.ReadFile(c.path)
	if err != nil {
		return err.Error()
	}
	f, err := os.CreateTemp("", "rnic-"+strings.ReplaceAll(t.Name(), "/", "-")+"-*.pcapng")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return err.Error()
	}
	return f.Name()
}

func startCapture(t *testing.T, ports []int) *capture {
	t.Helper()
	c := &capture{path: filepath.Join(t.TempDir(), "lo.pcapng")}
	var filter []string
	for _, p := range ports {
		filter = append(filter, "tcp port "+itoa(p))
	}
	// -B 64: a kernel buffer of 64 MiB holds all of a run's traffic (about
	// 20 MB), so a dumpcap that gets no CPU for a while on a loaded machine
	// (two VMs under TCG, other test packages) drops nothing. With the
	// default 2 MiB it once lost a connection's MPA Request, and with it the
	// dissection of that whole connection.
	c.cmd = exec.Command("tshark", "-i", "lo", "-B", "64", "-f", strings.Join(filter, " or "), "-w", c.path)
	pr, pw := io.Pipe()
	c.cmd.Stderr = io.MultiWriter(&c.errb, pw)
	childproc.DieWithParent(c.cmd, syscall.SIGTERM)
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("tshark: %v", err)
	}
	ready := make(chan bool, 1)
	go func() {
		buf := make([]byte, 4096)
		var seen []byte
		for {
			n, err := pr.Read(buf)
			seen = append(seen, buf[:n]...)
			if bytes.Contains(seen, []byte("Capturing on")) {
				ready <- true
				io.Copy(io.Discard, pr)
				return
			}
			if err != nil {
				ready <- false
				return
			}
		}
	}()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
		pw.Close()
	})
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("tshark did not start: %s", c.errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("tshark did not start capturing within 30 s: %s", c.errb.String())
	}
	time.Sleep(200 * time.Millisecond) // the filter is attached once it says so
	return c
}

func (c *capture) stop(t *testing.T) {
	time.Sleep(500 * time.Millisecond) // let the last FINs be captured
	c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-done
		t.Errorf("tshark did not stop on SIGINT")
	}
}

// tsharkRead dissects the capture with MPA found by the heuristic on any
// port (Wireshark's iwarp_mpa heuristic needs the MPA Request in the
// stream, which the capture has from the start).
func tsharkRead(t *testing.T, path string, extra ...string) string {
	t.Helper()
	args := append([]string{"-r", path, "-o", "tcp.check_checksum:FALSE",
		"--disable-heuristic", "rpcrdma_iwarp", "--enable-heuristic", "iwarp_mpa_tcp"}, extra...)
	out, err := exec.Command("tshark", args...).Output()
	if err != nil {
		t.Fatalf("tshark %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func (c *capture) check(t *testing.T, crc bool) {
	t.Helper()
	if fi, err := os.Stat(c.path); err != nil || fi.Size() == 0 {
		t.Fatalf("no capture: %v (tshark said %s)", err, c.errb.String())
	}
	// A packet the capture lost is a frame nobody checked: the checks below
	// would pass or fail on a part of the traffic.
	if m := droppedRe.FindStringSubmatch(c.errb.String()); m != nil && m[1] != "0" {
		t.Errorf("the capture dropped %s packets: the wire was not checked in full (dumpcap said: %s)", m[1], strings.TrimSpace(c.errb.String()))
	}
	frames := strings.Count(tsharkRead(t, c.path, "-T", "fields", "-e", "frame.number"), "\n")
	fpdus := strings.Count(tsharkRead(t, c.path, "-Y", "iwarp_ddp_rdmap", "-T", "fields", "-e", "frame.number"), "\n")
	malformed := strings.Count(tsharkRead(t, c.path, "-Y", "_ws.malformed", "-T", "fields", "-e", "frame.number"), "\n")
	verbose := tsharkRead(t, c.path, "-V", "-Y", "iwarp_mpa")
	bad := strings.Count(verbose, "Bad CRC") + strings.Count(verbose, "bad CRC") + strings.Count(verbose, "[Bad")
	good := strings.Count(verbose, "(Good CRC32)")
	reqs := strings.Count(tsharkRead(t, c.path, "-Y", "iwarp_mpa.req", "-T", "fields", "-e", "frame.number"), "\n")
	reps := strings.Count(tsharkRead(t, c.path, "-Y", "iwarp_mpa.rep", "-T", "fields", "-e", "frame.number"), "\n")
	badLen := strings.Count(tsharkRead(t, c.path, "-Y", "iwarp_mpa.bad_length || iwarp_mpa.reject_bit_responder", "-T", "fields", "-e", "frame.number"), "\n")
	t.Logf("tshark on lo: %d frames, %d with iWARP DDP/RDMAP PDUs, %d MPA Requests, %d Replies, %d good CRCs, %d bad CRCs, %d malformed, %d bad lengths or rejects",
		frames, fpdus, reqs, reps, good, bad, malformed, badLen)
	if malformed != 0 || bad != 0 || badLen != 0 {
		t.Errorf("tshark: %d malformed frames, %d bad CRCs, %d bad lengths or rejects (frames: %s; capture kept: %s)",
			malformed, bad, badLen, strings.Join(strings.Fields(tsharkRead(t, c.path, "-Y", "_ws.malformed || iwarp_mpa.bad_length",
				"-T", "fields", "-e", "frame.number")), ","), c.keep(t))
	}
	// rping both ways, and perftest's comm+data connections three times.
	if reqs < 8 || reps < 8 {
		t.Errorf("tshark saw %d MPA Requests and %d Replies, want 8 (2 rping + 3 x 2 perftest)", reqs, reps)
		c.explain(t)
	}
	if fpdus == 0 {
		t.Errorf("tshark decoded no iWARP PDUs")
	}
	if crc && good == 0 {
		t.Errorf("CRC variant: tshark verified no CRC")
	}
}

// explain logs what tells a frame the capture lost from one the dissector
// did not recognise: the capture's own drop count, the connections opened
// (SYNs), the segments that carry an MPA Request or Reply key whatever the
// dissector made of them, and the first payload of every TCP stream.
func (c *capture) explain(t *testing.T) {
	t.Helper()
	t.Logf("dumpcap said: %s", strings.TrimSpace(c.errb.String()))
	syns := tsharkRead(t, c.path, "-Y", "tcp.flags.syn == 1 && tcp.flags.ack == 0", "-T", "fields", "-e", "frame.number", "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.dstport")
	t.Logf("SYNs (frame, stream, ports):\n%s", syns)
	keys := tsharkRead(t, c.path, "-Y", `tcp.payload contains "MPA ID Req Frame" || tcp.payload contains "MPA ID Rep Frame"`,
		"-T", "fields", "-e", "frame.number", "-e", "tcp.stream", "-e", "tcp.len", "-e", "iwarp_mpa.req", "-e", "iwarp_mpa.rep", "-e", "_ws.col.Protocol")
	t.Logf("segments with an MPA key (frame, stream, length, req, rep, protocol):\n%s", keys)
	first := tsharkRead(t, c.path, "-Y", "tcp.len > 0 && tcp.seq == 1", "-T", "fields", "-e", "frame.number", "-e", "tcp.stream", "-e", "tcp.len", "-e", "_ws.col.Protocol", "-e", "_ws.col.Info")
	t.Logf("first payload of each direction (frame, stream, length, protocol, info):\n%s", first)
}
