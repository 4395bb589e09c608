package rnic

import (
	"context"
	"testing"
)

// TestNoAllocsSteadyState: once warmed up, the data path allocates nothing
// per operation, on either engine: a Send of 1 KiB (with the receiver
// reposting its buffer), an RDMA Write of 64 KiB, an RDMA Read of 4 KiB,
// Immediate Data and a Fetch-and-Add, each posted and completed one at a time, CRC on.
// testing.AllocsPerRun counts the allocations of the whole process, so
// both engines' receive and transmit goroutines are included.
func TestNoAllocsSteadyState(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	const nrecv = 4
	var rbuf *MR
	var recvs [nrecv]RecvWR
	a, b := newPair(t, pairOpts{qp: QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}}, func(a, b *side) {
		rbuf, _ = b.reg(nrecv<<10, LocalWrite)
		for i := range recvs {
			recvs[i] = RecvWR{ID: uint64(i), SGL: []SGE{{STag: rbuf.STag(), TO: uint64(i << 10), Len: 1 << 10}}}
			if _, err := b.qp.PostRecv(recvs[i]); err != nil {
				t.Fatal(err)
			}
		}
	})
	src, _ := a.reg(64<<10, LocalRead|LocalWrite|RemoteWrite) // RemoteWrite: a Read Response lands here
	sink, _ := b.reg(64<<10, LocalRead|LocalWrite|RemoteRead|RemoteWrite|RemoteAtomic)
	ctx := context.Background()
	var wc [1]WC
	wait := func(cq *CQ, op WROp) {
		if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Status != StatusSuccess || wc[0].Op != op {
			t.Fatalf("completion %+v (%v), want %s", wc[0], err, op)
		}
	}
	wrs := []struct {
		name string
		wr   SendWR
		recv bool
	}{
		{"send-1KiB", SendWR{Op: WRSend, SGL: []SGE{{STag: src.STag(), Len: 1 << 10}}}, true},
		{"write-64KiB", SendWR{Op: WRWrite, SGL: []SGE{{STag: src.STag(), Len: 64 << 10}},
			Remote: RemoteAddr{STag: sink.STag()}}, false},
		{"read-4KiB", SendWR{Op: WRRead, Local: SGE{STag: src.STag(), Len: 4 << 10},
			Remote: RemoteAddr{STag: sink.STag(), TO: 4096}}, false},
		{"immediate", SendWR{Op: WRImmediate, Imm: 0x0102030405060708}, true},
		{"fetch-add", SendWR{Op: WRFetchAdd, Local: SGE{STag: src.STag(), TO: 8, Len: 8},
			Remote: RemoteAddr{STag: sink.STag(), TO: 64}, AddSwap: 1}, false},
	}
	for _, w := range wrs {
		op := func() {
			// One WR by value, as most callers post: the variadic
			// list it makes must stay on the caller's stack.
			if _, err := a.qp.PostSend(w.wr); err != nil {
				t.Fatal(err)
			}
			wait(a.scq, w.wr.Op)
			if w.recv {
				wait(b.rcq, WRRecv)
				if _, err := b.qp.PostRecv(recvs[wc[0].ID]); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 200 { // warm up: buffers and queues reach their size
			op()
		}
		if n := testing.AllocsPerRun(500, op); n > 0.05 {
			t.Errorf("%s: %.2f allocations per operation in steady state", w.name, n)
		} else {
			t.Logf("%s: %.2f allocations per operation", w.name, n)
		}
	}
}
