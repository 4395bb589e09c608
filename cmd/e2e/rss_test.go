package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTargetRSS: the whole rtarget process (thin store, defaults) stays
// near 256 MiB of RSS serving a 1 GiB volume through rinit: fio writes
// 768 MiB of it sequentially, then mixes random 4 KiB reads and writes at
// QD64 and reads 1 MiB blocks back, while the test samples the process's
// VmHWM (peak RSS). The bound asserted is 288 MiB (measured: about 200).
func TestTargetRSS(t *testing.T) {
	needTools(t, "fio")
	if testing.Short() {
		t.Skip("-short")
	}
	rt, ri := bins(t)
	targetAddr, nbdAddr := freePort(t), freePort(t)
	tp := start(t, rt, "serve", "--data", t.TempDir(), "--listen", targetAddr, "--volume", "vol:1G")
	waitPort(t, targetAddr, tp)
	ip := start(t, ri, "nbd", "--target", targetAddr, "--volume", "vol", "--listen", nbdAddr)
	waitPort(t, nbdAddr, ip)
	uri := "nbd://" + nbdAddr + "/vol"
	status := func(field string) int64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(tp.cmd.Process.Pid) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				f := strings.Fields(v)
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n >> 10 // MiB
			}
		}
		t.Fatalf("no %s in /proc/PID/status", field)
		return 0
	}
	jobs := [][]string{
		{"--rw=write", "--bs=1m", "--iodepth=8", "--size=768m"},
		{"--rw=randrw", "--rwmixread=70", "--bs=4k", "--iodepth=64", "--size=768m", "--time_based", "--runtime=6", "--norandommap"},
		{"--rw=read", "--bs=1m", "--iodepth=8", "--size=768m", "--time_based", "--runtime=4"},
	}
	for _, j := range jobs {
		t0 := time.Now()
		run(t, 5*time.Minute, "fio", append([]string{"--name=rss", "--ioengine=nbd", "--uri=" + uri}, j...)...)
		t.Logf("fio %s: %.1fs; rtarget VmHWM %d MiB, now RssAnon %d MiB RssFile %d MiB", strings.Join(j, " "),
			time.Since(t0).Seconds(), status("VmHWM"), status("RssAnon"), status("RssFile"))
	}
	if hwm := status("VmHWM"); hwm > 288 {
		t.Errorf("rtarget peak RSS %d MiB, over the 288 MiB bound", hwm)
	}
}
