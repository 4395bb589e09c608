//go:build ceph

package rbd_test

import (
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/cephtest"
)

// cpuTime is the CPU time (user + system) of this process so far: the
// client's, librados' threads included.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the client CPU per request since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-us/op")
}

// BenchmarkQueueDepth compares ways of keeping 16 requests of 4 KiB in
// flight on one image: 16 goroutines making synchronous librbd calls
// (go-ceph's; each blocks an OS thread in cgo for the round trip, and the
// scheduler hands its P to another thread), 16 goroutines each waiting on
// a channel for its own aio request (Image.ReadAt and WriteAt, what the
// store uses), and one goroutine keeping 16 aio requests in flight.
// Interleave them (-count) and compare ns/op and the client CPU per
// request (cpu-us/op).
func BenchmarkQueueDepth(b *testing.B) {
	const qd, bs, size = 16, 4096, 256 << 20
	c := cephtest.Connect(b, conf, 30*time.Second)
	spec := cephtest.Namespace(b, conf, c)
	p, err := c.OpenPool(spec, false)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := p.Create("bench", size); err != nil {
		b.Fatal(err)
	}
	// Fill it, so reads read data.
	img, err := p.Open("bench")
	if err != nil {
		b.Fatal(err)
	}
	fill := make([]byte, 4<<20)
	for off := int64(0); off < size; off += int64(len(fill)) {
		if err := img.WriteAt(fill, off); err != nil {
			b.Fatal(err)
		}
	}
	img.Close()
	offsets := func(seed uint64) func() uint64 {
		r := rand.New(rand.NewPCG(seed, 1))
		return func() uint64 { return uint64(r.IntN(size/bs)) * bs }
	}
	for _, rw := range []struct {
		name string
		op   int
	}{{"randread", 0}, {"randwrite", 1}} {
		for _, mode := range []string{"sync", "aio"} {
			b.Run(rw.name+"/goroutines-"+mode, func(b *testing.B) {
				img, err := p.Open("bench")
				if err != nil {
					b.Fatal(err)
				}
				defer img.Close()
				var wg sync.WaitGroup
				work := make(chan struct{}, qd)
				b.ResetTimer()
				cpu0 := cpuTime()
				defer func() { reportCPU(b, cpu0) }()
				for w := range qd {
					wg.Add(1)
					go func() {
						defer wg.Done()
						buf, next := make([]byte, bs), offsets(uint64(w))
						for range work {
							var err error
							switch {
							case rw.op == 0 && mode == "sync":
								err = img.SyncReadAt(buf, int64(next()))
							case rw.op == 0:
								err = img.ReadAt(buf, int64(next()))
							case mode == "sync":
								err = img.SyncWriteAt(buf, int64(next()))
							default:
								err = img.WriteAt(buf, int64(next()))
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				for range b.N {
					work <- struct{}{}
				}
				close(work)
				wg.Wait()
			})
		}
		b.Run(rw.name+"/pipelined-aio", func(b *testing.B) {
			a, err := p.OpenAio("bench")
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			bufs := make([][]byte, qd)
			for i := range bufs {
				bufs[i] = make([]byte, bs)
			}
			next := offsets(99)
			type slot struct {
				i    int
				done <-chan int
			}
			inflight := make([]slot, 0, qd)
			b.ResetTimer()
			cpu0 := cpuTime()
			defer func() { reportCPU(b, cpu0) }()
			for n := 0; n < b.N; n++ {
				i := n % qd
				if len(inflight) == qd {
					s := inflight[0]
					inflight = inflight[1:]
					if r := <-s.done; r < 0 {
						b.Fatalf("aio: %d", r)
					}
					i = s.i
				}
				done, err := a.Submit(rw.op, bufs[i], next())
				if err != nil {
					b.Fatal(err)
				}
				inflight = append(inflight, slot{i, done})
			}
			for _, s := range inflight {
				if r := <-s.done; r < 0 {
					b.Fatalf("aio: %d", r)
				}
			}
		})
	}
}
