package nvmf

import (
	"crypto/rand"
	"os"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// Benchmarks of the target's data path with the test host over loopback,
// on the memory store: 4 KiB reads (RDMA Write) and in-capsule writes,
// 128 KiB keyed writes (RDMA Read), at queue depth 16. allocs/op counts
// the allocations of both ends (host and target share the process).

func benchIO(b *testing.B, write bool, size int, keyed bool) {
	e := newTestEnv(b, envOpts{volumes: map[string]int64{"vol0": 256 << 20}, thin: os.Getenv("NVMF_BENCH_THIN") != ""})
	h := connectHost(b, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 1, qsize: 32})
	data := make([]byte, size)
	rand.Read(data)
	const qd = 16
	blocks := uint64(size / store.BlockSize)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N / qd
	for w := 0; w < qd; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				lba := uint64((w*per+i)%2048) * blocks
				var st Status
				var err error
				if write {
					st, err = h.write(0, lba, data, keyed)
				} else {
					_, st, err = h.read(0, lba, int(blocks))
				}
				if err != nil || st != StatusSuccess {
					b.Errorf("%v %v", st, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkRead4K(b *testing.B)           { benchIO(b, false, 4096, false) }
func BenchmarkWrite4KInCapsule(b *testing.B) { benchIO(b, true, 4096, false) }
func BenchmarkWrite128KKeyed(b *testing.B)   { benchIO(b, true, 128<<10, true) }
