package nbd

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// BenchmarkFioRandRead runs fio's nbd engine (randread, 4 KiB, iodepth 16,
// 10 s) against this server over a 1 GiB memory backend and, in the same
// run, against `nbdkit memory 1G`, and reports both and their ratio. It
// measures; it asserts nothing about speed.
func BenchmarkFioRandRead(b *testing.B) {
	needTools(b, "fio", "nbdkit")
	fioArgs := func(uri string) []string {
		return []string{"--name=randread", "--ioengine=nbd", "--uri=" + uri, "--rw=randread", "--bs=4k",
			"--iodepth=16", "--time_based", "--runtime=10s", "--size=1G", "--randrepeat=0"}
	}
	m := newMem(1 << 30)
	s := serve(b, &Server{Exports: []Export{{Name: "vol", Backend: m, MultiConn: true}}})

	port := freePort(b)
	kit := exec.Command("nbdkit", "-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", strconv.Itoa(port), "memory", "1G")
	if err := kit.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = kit.Process.Kill(); _ = kit.Wait() })
	waitPort(b, port)

	for b.Loop() {
		ours := runFio(b, time.Minute, fioArgs("nbd://"+s.addr+"/vol")...).Jobs[0]
		theirs := runFio(b, time.Minute, fioArgs(fmt.Sprintf("nbd://127.0.0.1:%d/", port))...).Jobs[0]
		if ours.Error != 0 || theirs.Error != 0 {
			b.Fatalf("fio errors: ours %d, nbdkit %d", ours.Error, theirs.Error)
		}
		b.ReportMetric(ours.Read.IOPS, "iops")
		b.ReportMetric(theirs.Read.IOPS, "nbdkit-iops")
		b.ReportMetric(ours.Read.IOPS/theirs.Read.IOPS, "ratio")
		b.Logf("fio randread 4k iodepth 16, 10 s: this server %.0f IOPS, nbdkit memory %.0f IOPS, ratio %.2f",
			ours.Read.IOPS, theirs.Read.IOPS, ours.Read.IOPS/theirs.Read.IOPS)
	}
}

// BenchmarkRead4K measures the server alone: 4 KiB reads kept 16 deep on
// one connection by the raw test client.
func BenchmarkRead4K(b *testing.B) {
	m := newMem(64 << 20)
	s := serve(b, &Server{Exports: []Export{{Name: "vol", Backend: m}}})
	c := dial(b, s.addr, clientFlagFixedNewstyle)
	c.goExport("vol")
	_ = c.nc.SetDeadline(time.Time{})
	const depth = 16
	b.SetBytes(4096)
	sent, recv := 0, 0
	for b.Loop() {
		for sent-recv < depth {
			c.send(CmdRead, 0, uint64(sent), uint64(sent%16384)*4096, 4096, nil)
			sent++
		}
		if r := c.reply(); r.errno != 0 {
			b.Fatal(r.errno)
		}
		recv++
	}
	for recv < sent {
		c.reply()
		recv++
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(t testing.TB, port int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("port %d not listening: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
