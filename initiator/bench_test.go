package initiator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/target"
)

// BenchmarkReadAt and BenchmarkWriteAt: 4 KiB requests at random
// 4 KiB-aligned offsets, one at a time and 16 at once, and 1 MiB requests
// at random 1 MiB-aligned offsets 4 at once, through the whole block
// protocol over loopback, with the memory store and with the thin store on disk.
// The 64 MiB region is written once before the timer starts, so reads
// find data (the thin store reads unallocated blocks as zeros without any
// I/O). bench/ quotes them.
func BenchmarkReadAt(b *testing.B)  { benchIO(b, false) }
func BenchmarkWriteAt(b *testing.B) { benchIO(b, true) }

func benchIO(b *testing.B, write bool) {
	for _, thin := range []bool{false, true} {
		for _, c := range []struct{ size, qd int }{{4096, 1}, {4096, 16}, {1 << 20, 4}} {
			st := "memory"
			if thin {
				st = "thin"
			}
			b.Run(fmt.Sprintf("%s/%dK-qd%d", st, c.size>>10, c.qd), func(b *testing.B) {
				const span = 64 << 20
				e := newEnv(b, envOpts{size: span, thin: thin})
				cl := e.client("bench", nil)
				defer cl.Close()
				ctx := context.Background()
				fill := make([]byte, 1<<20)
				for i := range fill {
					fill[i] = byte(i * 7)
				}
				for off := int64(0); off < span; off += int64(len(fill)) {
					if err := cl.WriteAt(ctx, fill, off, false); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(c.size))
				b.ResetTimer()
				var wg sync.WaitGroup
				per := max(b.N/c.qd, 1)
				for g := 0; g < c.qd; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(g), 77))
						buf := make([]byte, c.size)
						for i := 0; i < per; i++ {
							off := r.Int64N(span/int64(c.size)) * int64(c.size)
							var err error
							if write {
								err = cl.WriteAt(ctx, buf, off, false)
							} else {
								err = cl.ReadAt(ctx, buf, off)
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					}(g)
				}
				wg.Wait()
			})
		}
	}
}

// BenchmarkReadInline compares, size by size at QD1, reads answered
// inline (DATA) with reads through READY + RDMA Read + RELEASE: the data
// behind the inline limit's default.
func BenchmarkReadInline(b *testing.B) {
	for _, size := range []int{4096, 8192, 16384} {
		for _, inline := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dK-inline=%v", size>>10, inline), func(b *testing.B) {
				e := newEnv(b, envOpts{size: 64 << 20, tcfg: func(c *target.Config) { c.MaxInline = blockproto.MaxInline }})
				cl := e.client("bench", func(c *initiator.Config) {
					c.InlineRead = -1
					if inline {
						c.InlineRead = size
					}
				})
				defer cl.Close()
				ctx := context.Background()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := cl.ReadAt(ctx, buf, int64(i*size)%(32<<20)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
