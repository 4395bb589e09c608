package initiator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/target"
)

// BenchmarkReadAt and BenchmarkWriteAt: one 4 KiB (or 1 MiB) request at a
// time, and qd goroutines at once, through the whole block protocol
// (memory store, loopback). bench/ quotes them.
func BenchmarkReadAt(b *testing.B)  { benchIO(b, false) }
func BenchmarkWriteAt(b *testing.B) { benchIO(b, true) }

func benchIO(b *testing.B, write bool) {
	for _, c := range []struct{ size, qd int }{{4096, 1}, {4096, 16}, {1 << 20, 4}} {
		b.Run(fmt.Sprintf("%dK-qd%d", c.size>>10, c.qd), func(b *testing.B) {
			e := newEnv(b, envOpts{size: 256 << 20})
			cl := e.client("bench", nil)
			defer cl.Close()
			ctx := context.Background()
			const span = 128 << 20
			b.SetBytes(int64(c.size))
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / c.qd
			for g := 0; g < c.qd; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					buf := make([]byte, c.size)
					for i := 0; i < per; i++ {
						off := int64((g*per+i)*c.size) % span
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
