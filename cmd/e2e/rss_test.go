package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTargetRSS: the peak RSS (VmHWM) of the whole rtarget process (thin
// store, default flags) serving 8 sessions (8 rinit nbd processes) over 3
// volumes of 64 GiB while fio writes at random (4 KiB, QD16 per session,
// spread over the whole volumes), then reads at random. The store issue's
// scenario is 4 GiB written and 2 GiB read against a bound of 128 MiB
// (RNIC_RSS_SCALE=1 RNIC_RSS_BOUND=128); make test runs it at 1/4 of that
// (RNIC_RSS_SCALE=4) against a bound that catches regressions
// (RNIC_RSS_BOUND, 120 MiB: 82-92 MiB measured with serve's default
// --memory-limit, 153 without it). The data files are never mapped; what
// grows is the maps of the open volumes (8 bytes per cluster written), the
// sessions' buffers and badger (see store/doc.go, Memory).
func TestTargetRSS(t *testing.T) {
	needTools(t, "fio")
	if testing.Short() {
		t.Skip("-short")
	}
	scale := envInt(t, "RNIC_RSS_SCALE", 4)
	rt, ri := bins(t)
	targetAddr := freePort(t)
	tp := start(t, rt, "serve", "--data", t.TempDir(), "--listen", targetAddr,
		"--volume", "v0:64G", "--volume", "v1:64G", "--volume", "v2:64G")
	waitPort(t, targetAddr, tp)
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
	const sessions = 8
	var uris []string
	for i := range sessions {
		addr := freePort(t)
		vol := fmt.Sprintf("v%d", i%3)
		p := start(t, ri, "nbd", "--target", targetAddr, "--volume", vol, "--listen", addr, "--name", fmt.Sprintf("rss%d", i))
		waitPort(t, addr, p)
		uris = append(uris, "nbd://"+addr+"/"+vol)
	}
	phase := func(rw string, total int64) {
		t0 := time.Now()
		var wg sync.WaitGroup
		for i, uri := range uris {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(t, 10*time.Minute, "fio", "--name=rss", "--ioengine=nbd", "--uri="+uri, "--rw="+rw, "--bs=4k",
					"--iodepth=16", "--norandommap", "--randrepeat=0", fmt.Sprintf("--randseed=%d", i+1),
					fmt.Sprintf("--io_size=%d", total/sessions))
			}()
		}
		wg.Wait()
		t.Logf("%d sessions, %s of %s: %.1fs; rtarget VmHWM %d MiB, now RssAnon %d MiB RssFile %d MiB", sessions, rw,
			formatBytes(total), time.Since(t0).Seconds(), status("VmHWM"), status("RssAnon"), status("RssFile"))
	}
	phase("randwrite", 4<<30/int64(scale))
	phase("randread", 2<<30/int64(scale))
	bound := int64(envInt(t, "RNIC_RSS_BOUND", 120))
	if hwm := status("VmHWM"); hwm > bound {
		t.Errorf("rtarget peak RSS %d MiB, over the %d MiB bound", hwm, bound)
	}
}

func formatBytes(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
