//go:build ceph

package rbdtest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

const (
	crashVolBlocks = 8192 // 32 MiB: 8 RADOS objects
	crashMaxWrite  = 2048 // blocks: up to 8 MiB, spanning 2-3 objects
)

// TestRBDCrashChild is the writer TestRBDCrash kills: it writes pattern
// blocks (storetest.FillBlock, tag = the write's sequence number) in
// random ranges that cross object boundaries, one write at a time, and
// prints "start LBA N TAG" before and "ack LBA N TAG" after each.
func TestRBDCrashChild(t *testing.T) {
	spec := os.Getenv("RNIC_RBD_CRASH_POOL")
	if spec == "" {
		t.Skip("the child of TestRBDCrash")
	}
	s := openStore(t, spec)
	v, err := s.OpenVolume(context.Background(), "crash")
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for tag := uint64(1); ; tag++ {
		n := 1 + r.IntN(crashMaxWrite)
		lba := uint64(r.IntN(crashVolBlocks - n + 1))
		fmt.Fprintf(w, "start %d %d %d\n", lba, n, tag)
		w.Flush()
		if err := v.WriteBlocks(context.Background(), lba, storetest.Pattern(lba, n, tag), false); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(w, "ack %d %d %d\n", lba, n, tag)
		w.Flush()
	}
}

// TestRBDCrash kills (-9) a process writing to an rbd volume and checks
// what the store's crash contract promises: every acknowledged write is
// there (rbd_cache is off: an acknowledged write is on every replica),
// the write in flight at the kill is there, absent, or there in part, and
// every block holds either its old or its new content, whole. It repeats
// this a few times and reports how many writes in flight were torn across
// objects.
func TestRBDCrash(t *testing.T) {
	s, spec := freshStore(t)
	ctx := context.Background()
	if _, err := s.CreateVolume(ctx, "crash", crashVolBlocks*store.BlockSize, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	last := make([]uint64, crashVolBlocks) // acknowledged tag per block
	torn, lost, landed := 0, 0, 0
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRBDCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RNIC_RBD_CRASH_POOL="+spec)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Let it write for a while (past its start-up), then kill it.
		kill := time.After(2*time.Second + time.Duration(round)*700*time.Millisecond)
		var inflight [3]uint64
		var have bool
		acks := 0
	read:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break read
				}
				var lba, n, tag uint64
				f := strings.Fields(l)
				if len(f) != 4 {
					continue
				}
				fmt.Sscan(f[1]+" "+f[2]+" "+f[3], &lba, &n, &tag)
				if f[0] == "start" {
					inflight, have = [3]uint64{lba, n, tag}, true
				} else if f[0] == "ack" {
					for b := lba; b < lba+n; b++ {
						last[b] = tag
					}
					have = false
					acks++
				}
			case <-kill:
				cmd.Process.Signal(syscall.SIGKILL)
				kill = nil
			}
		}
		cmd.Wait()
		if acks == 0 {
			t.Fatalf("round %d: the writer acknowledged nothing before the kill", round)
		}
		// Reopening takes the volume over from the dead writer.
		v, err := s.OpenVolume(ctx, "crash")
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, crashVolBlocks*store.BlockSize)
		if err := v.ReadBlocks(ctx, 0, got); err != nil {
			t.Fatal(err)
		}
		newBlocks, oldBlocks := 0, 0
		for b := range uint64(crashVolBlocks) {
			blk := got[b*store.BlockSize : (b+1)*store.BlockSize]
			tag, ok := storetest.BlockTag(blk, b)
			if !ok {
				t.Fatalf("round %d: block %d is torn or misplaced", round, b)
			}
			inFlight := have && b >= inflight[0] && b < inflight[0]+inflight[1]
			switch {
			case tag == last[b]:
				if inFlight {
					oldBlocks++
				}
			case inFlight && tag == inflight[2]:
				newBlocks++
				last[b] = tag
			default:
				t.Fatalf("round %d: block %d has tag %d; acknowledged %d, in flight %v", round, b, tag, last[b], inflight)
			}
		}
		switch {
		case !have:
		case newBlocks > 0 && oldBlocks > 0:
			torn++
		case newBlocks > 0:
			landed++
		default:
			lost++
		}
		t.Logf("round %d: %d writes acknowledged, all there; the write in flight (%d blocks): %d blocks new, %d old",
			round, acks, inflight[1], newBlocks, oldBlocks)
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("writes in flight at the kill: %d landed whole, %d absent, %d in part (per object)", landed, lost, torn)
}
