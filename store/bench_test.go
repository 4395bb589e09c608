package store

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// Benchmarks of both backends. Each backend gets one store and one 1 GiB
// volume whose first benchPrefill bytes are written before the read
// benchmarks. Run with: go test -run '^$' -bench . ./store/
const (
	benchVolume  = 1 << 30
	benchPrefill = 256 << 20
)

func BenchmarkMemory(b *testing.B) {
	benchBackend(b, func(b *testing.B) Store { return NewMemory() })
}

func BenchmarkBadger(b *testing.B) { benchBadger(b, BadgerOptions{}) }

// BenchmarkBadgerNoTrim keeps every value log page mapped (no RSS budget):
// reads of data in the page cache are cheaper, the RSS grows with the data.
func BenchmarkBadgerNoTrim(b *testing.B) { benchBadger(b, BadgerOptions{MappedBudget: -1}) }

func benchBadger(b *testing.B, opts BadgerOptions) {
	benchBackend(b, func(b *testing.B) Store {
		s, err := OpenBadger(b.TempDir(), opts)
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}

func benchBackend(b *testing.B, open func(b *testing.B) Store) {
	ctx := context.Background()
	s := open(b)
	defer s.Close()
	v := mustCreate(b, s, "bench", benchVolume)
	defer v.Close()
	const prefillBlocks = benchPrefill / BlockSize
	chunk := patternBlocks(0, 256, 1)
	for lba := uint64(0); lba < prefillBlocks; lba += 256 {
		mustWrite(b, v, lba, chunk)
	}
	if err := v.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	var bs *badgerBackend
	if vs, ok := s.(*volumeStore); ok {
		bs, _ = vs.be.(*badgerBackend)
	}
	reportSyncs := func(b *testing.B, before int64) {
		if bs != nil {
			b.ReportMetric(float64(bs.syncs.Load()-before)/float64(b.N), "syncs/op")
		}
	}
	syncsNow := func() int64 {
		if bs == nil {
			return 0
		}
		return bs.syncs.Load()
	}
	const volBlocks = benchVolume / BlockSize

	b.Run("RandRead4K", func(b *testing.B) {
		buf := make([]byte, BlockSize)
		rng := rand.New(rand.NewPCG(1, 2))
		b.SetBytes(BlockSize)
		for b.Loop() {
			if err := v.ReadBlocks(ctx, rng.Uint64N(prefillBlocks), buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RandRead4KParallel", func(b *testing.B) {
		b.SetBytes(BlockSize)
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			buf := make([]byte, BlockSize)
			rng := rand.New(rand.NewPCG(seed.Add(1), 3))
			for pb.Next() {
				if err := v.ReadBlocks(ctx, rng.Uint64N(prefillBlocks), buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("RandWrite4K", func(b *testing.B) {
		buf := patternBlocks(0, 1, 2)
		rng := rand.New(rand.NewPCG(4, 5))
		b.SetBytes(BlockSize)
		for b.Loop() {
			if err := v.WriteBlocks(ctx, rng.Uint64N(volBlocks), buf, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RandWrite4KParallel", func(b *testing.B) {
		b.SetBytes(BlockSize)
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			buf := patternBlocks(0, 1, 2)
			rng := rand.New(rand.NewPCG(seed.Add(1), 6))
			for pb.Next() {
				if err := v.WriteBlocks(ctx, rng.Uint64N(volBlocks), buf, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("SeqWrite1M", func(b *testing.B) {
		buf := patternBlocks(0, 256, 3)
		b.SetBytes(int64(len(buf)))
		lba := uint64(0)
		for b.Loop() {
			if err := v.WriteBlocks(ctx, lba, buf, false); err != nil {
				b.Fatal(err)
			}
			lba = (lba + 256) % volBlocks
		}
	})
	b.Run("SeqRead1M", func(b *testing.B) {
		buf := make([]byte, 256*BlockSize)
		b.SetBytes(int64(len(buf)))
		lba := uint64(0)
		for b.Loop() {
			if err := v.ReadBlocks(ctx, lba, buf); err != nil {
				b.Fatal(err)
			}
			lba = (lba + 256) % prefillBlocks
		}
	})
	b.Run("FUAWrite4K", func(b *testing.B) {
		buf := patternBlocks(0, 1, 4)
		b.SetBytes(BlockSize)
		before := syncsNow()
		lba := uint64(0)
		for b.Loop() {
			if err := v.WriteBlocks(ctx, lba, buf, true); err != nil {
				b.Fatal(err)
			}
			lba = (lba + 1) % volBlocks
		}
		reportSyncs(b, before)
	})
	b.Run("FUAWrite4KParallel16", func(b *testing.B) {
		b.SetBytes(BlockSize)
		b.SetParallelism(8) // 8 x GOMAXPROCS goroutines
		before := syncsNow()
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			buf := patternBlocks(0, 1, 5)
			rng := rand.New(rand.NewPCG(seed.Add(1), 7))
			for pb.Next() {
				if err := v.WriteBlocks(ctx, rng.Uint64N(volBlocks), buf, true); err != nil {
					b.Fatal(err)
				}
			}
		})
		reportSyncs(b, before)
	})
}
