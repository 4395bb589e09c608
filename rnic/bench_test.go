package rnic

import (
	"io"
	"net"
	"testing"
)

// Benchmarks of the engine against raw Go TCP on the same loopback, in the
// same run. Compare the pairs: BenchmarkWriteStream vs BenchmarkTCPStream,
// BenchmarkRead4K vs BenchmarkTCPPingPong4K.

func benchPair(b *testing.B, o pairOpts) (*side, *side) {
	b.Helper()
	return newPair(b, o, nil)
}

// BenchmarkWriteStream streams 64 KiB RDMA Writes on one QP with CRC on,
// keeping up to 64 in flight (one signaled completion every 16).
func BenchmarkWriteStream(b *testing.B) {
	const size = 64 << 10
	a, t := benchPair(b, pairOpts{qp: QPConfig{SQDepth: 256, InboundWrite: true}})
	src, _ := a.reg(size, LocalRead)
	sink, _ := t.reg(size, LocalWrite|RemoteWrite)
	b.SetBytes(size)
	b.ResetTimer()
	inflight := 0
	for i := 0; i < b.N; i++ {
		signaled := i%16 == 15 || i == b.N-1
		for inflight >= 64 {
			a.waitOK(a.scq, WRWrite)
			inflight -= 16
		}
		a.post(SendWR{ID: uint64(i), Op: WRWrite, Unsignaled: !signaled, SGL: []SGE{{STag: src.STag(), Len: size}},
			Remote: RemoteAddr{STag: sink.STag()}})
		inflight++
	}
	for inflight > 0 {
		wc := a.waitOK(a.scq, WRWrite)
		if wc.ID == uint64(b.N-1) {
			break
		}
		inflight -= 16
	}
}

// BenchmarkTCPStream is the raw-TCP peer of BenchmarkWriteStream: 64 KiB
// writes on a loopback socket drained by a reader goroutine.
func BenchmarkTCPStream(b *testing.B) {
	const size = 64 << 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		buf := make([]byte, 256<<10)
		var n int64
		for {
			k, err := c.Read(buf)
			n += int64(k)
			if err != nil {
				done <- n
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	<-done
	c.Close()
}

// BenchmarkRead4K measures one 4 KiB RDMA Read round trip at a time.
func BenchmarkRead4K(b *testing.B) {
	const size = 4096
	a, t := benchPair(b, pairOpts{})
	src, _ := t.reg(size, LocalRead|RemoteRead)
	sink, _ := a.reg(size, LocalWrite|RemoteWrite)
	wr := SendWR{Op: WRRead, Local: SGE{STag: sink.STag(), Len: size}, Remote: RemoteAddr{STag: src.STag()}}
	var wc [1]WC
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wr.ID = uint64(i)
		if _, err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if _, err := a.scq.Wait(b.Context(), wc[:]); err != nil || wc[0].Status != StatusSuccess {
			b.Fatalf("read: %v %+v", err, wc[0])
		}
	}
}

// BenchmarkTCPPingPong4K is the raw-TCP peer of BenchmarkRead4K: a 64-byte
// request answered by 4 KiB, one at a time.
func BenchmarkTCPPingPong4K(b *testing.B) {
	const size = 4096
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req := make([]byte, 64)
		resp := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			if _, err := c.Write(resp); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	req := make([]byte, 64)
	resp := make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendRecv measures the 64-byte Send/Receive message rate with up
// to 128 messages in flight. The receiver returns a credit for every
// receive it re-posts, as a ULP must (a Send finding no receive is fatal).
func BenchmarkSendRecv(b *testing.B) {
	const size = 64
	const depth = 128
	a, t := benchPair(b, pairOpts{qp: QPConfig{SQDepth: 512, RQDepth: 512, InboundWrite: true}})
	rbuf, _ := t.reg(size*depth, LocalWrite)
	for i := 0; i < depth; i++ {
		t.qp.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{STag: rbuf.STag(), TO: uint64(i * size), Len: size}}})
	}
	src, _ := a.reg(size, LocalRead)
	credits := make(chan int, depth)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wcs [32]WC
		for got := 0; got < b.N; {
			n, err := t.rcq.Wait(b.Context(), wcs[:])
			if err != nil {
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != StatusSuccess {
					b.Errorf("receive: %+v", wc)
					return
				}
				t.qp.PostRecv(RecvWR{ID: wc.ID, SGL: []SGE{{STag: rbuf.STag(), TO: wc.ID * size, Len: size}}})
			}
			got += n
			credits <- n
		}
	}()
	b.ResetTimer()
	avail := depth
	var wcs [32]WC
	for i := 0; i < b.N; i++ {
		for avail == 0 {
			avail += <-credits
		}
		a.post(SendWR{ID: uint64(i), Op: WRSend, Unsignaled: i%16 != 15, SGL: []SGE{{STag: src.STag(), Len: size}}})
		avail--
		a.scq.Poll(wcs[:])
	}
	<-done // every message received
}

// BenchmarkFetchAdd measures pipelined Fetch-and-Add operations per second.
func BenchmarkFetchAdd(b *testing.B) {
	a, t := benchPair(b, pairOpts{qp: QPConfig{SQDepth: 256, IRD: 16, ORD: 16, InboundAtomic: true, InboundWrite: true}})
	word, _ := t.reg(8, LocalWrite|RemoteAtomic)
	res, _ := a.reg(8*64, LocalWrite)
	b.ResetTimer()
	inflight := 0
	for i := 0; i < b.N; i++ {
		for inflight >= 32 {
			a.waitOK(a.scq, WRFetchAdd)
			inflight--
		}
		a.post(SendWR{ID: uint64(i), Op: WRFetchAdd, Local: SGE{STag: res.STag(), TO: uint64(i%64) * 8, Len: 8},
			Remote: RemoteAddr{STag: word.STag()}, AddSwap: 1})
		inflight++
	}
	for ; inflight > 0; inflight-- {
		a.waitOK(a.scq, WRFetchAdd)
	}
}
