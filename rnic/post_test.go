package rnic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// postUntilRefused posts WRs on qp until posting is refused with
// ErrInvalidQPState and returns how many were accepted. After limit WRs it
// stops posting and waits for the QP to leave RTS, then posts once more: a
// test whose completions must all fit its CQ posts no more than the CQ
// holds.
func postUntilRefused(qp *QP, recv bool, mr *MR, limit int) (int, error) {
	n := 0
	for {
		if n == limit {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := qp.WaitState(ctx, StateError, StateTerminate, StateClosing, StateIdle)
			cancel()
			if err != nil {
				return n, err
			}
		}
		var err error
		var k int
		if recv {
			k, err = qp.PostRecv(RecvWR{ID: uint64(n), SGL: []SGE{{STag: mr.STag(), Len: 8}}})
		} else {
			k, err = qp.PostSend(SendWR{ID: uint64(n), Op: WRWrite, Remote: RemoteAddr{STag: 0}})
		}
		n += k
		switch {
		case err == nil:
		case errors.Is(err, ErrTooManyWRs):
			runtime.Gosched()
		case errors.Is(err, ErrInvalidQPState):
			return n, nil
		default:
			return n, fmt.Errorf("post: %w", err)
		}
		if n > limit {
			return n, fmt.Errorf("%d WRs posted, the limit was %d", n, limit)
		}
	}
}

// TestPostFlushRace: posting and flushing are atomic with respect to each
// other. A poster races Modify QP ->Error; every WR it managed to post must
// complete exactly once (successfully or Flushed), none may be left behind
// in a queue nobody will flush again (the state check and the queuing
// happen under one lock the flush takes too).
func TestPostFlushRace(t *testing.T) {
	// race posts until refused on both queues of qp while modify moves it
	// to Error, and returns how many sends and receives were posted.
	race := func(t *testing.T, qp *QP, mr *MR, limit int, modify func() error) (sends, recvs int) {
		var wg sync.WaitGroup
		var serr, rerr error
		wg.Add(2)
		go func() { defer wg.Done(); sends, serr = postUntilRefused(qp, false, mr, limit) }()
		go func() { defer wg.Done(); recvs, rerr = postUntilRefused(qp, true, mr, limit) }()
		merr := modify()
		wg.Wait()
		if err := errors.Join(merr, serr, rerr); err != nil {
			t.Fatal(err)
		}
		return sends, recvs
	}
	t.Run("idle", func(t *testing.T) {
		d, pd, _, _, mr, _ := idleQP(t, 64, 16)
		cq, err := d.CreateCQ(1<<16, 0)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, SQDepth: 16, RQDepth: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2000; i++ {
			// In Idle nothing completes: the queues' depths bound what is posted.
			sends, recvs := race(t, qp, mr, 1<<16, func() error {
				for k := 0; k < i%7; k++ {
					runtime.Gosched()
				}
				return qp.Modify(StateError, ModifyAttrs{})
			})
			var gotS, gotR int
			for _, wc := range drainCQ(cq) {
				if wc.Op == WRRecv {
					gotR++
				} else {
					gotS++
				}
			}
			if gotS != sends || gotR != recvs {
				t.Fatalf("iteration %d: %d sends and %d receives posted, %d and %d completed", i, sends, recvs, gotS, gotR)
			}
			if err := qp.Modify(StateIdle, ModifyAttrs{}); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("rts", func(t *testing.T) {
		for i := 0; i < 30; i++ {
			a, _ := newPair(t, pairOpts{qp: QPConfig{SQDepth: 64, InboundWrite: true, InboundRead: true}}, nil)
			mr, _ := a.reg(64, LocalWrite)
			// The Writes complete as fast as they are posted: more than the
			// send CQ holds would overflow it and end the stream in Error
			// before the Modify.
			entries, _ := a.scq.Query()
			sends, recvs := race(t, a.qp, mr, entries, func() error {
				time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
				return a.qp.Modify(StateError, ModifyAttrs{})
			})
			a.waitState(StateError)
			var gotS, gotR int
			for _, wc := range drainCQ(a.scq) {
				if wc.Status != StatusSuccess && wc.Status != StatusFlushed {
					t.Fatalf("send completion %+v", wc)
				}
				gotS++
			}
			for _, wc := range drainCQ(a.rcq) {
				if wc.Status != StatusFlushed {
					t.Fatalf("receive completion %+v", wc)
				}
				gotR++
			}
			if gotS != sends || gotR != recvs {
				t.Fatalf("iteration %d: %d sends and %d receives posted, %d and %d completed", i, sends, recvs, gotS, gotR)
			}
		}
	})
}

// TestSendGathered: a mark names the WRs PostSendMarked queued, and
// SendGathered tells whether the transmitter has gathered each: not while
// the transmitter is held (the test holds its lock, as sendLeftOnSQ does),
// then yes once the peer received them. A zero mark names nothing.
func TestSendGathered(t *testing.T) {
	var bRecv *MR
	a, b := newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(3*64, LocalWrite)
		for i := range 3 {
			if _, err := b.qp.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{STag: bRecv.STag(), TO: uint64(i) * 64, Len: 64}}}); err != nil {
				t.Fatal(err)
			}
		}
	})
	msg, _ := a.reg(16, LocalRead)
	send := func(id uint64) SendWR {
		return SendWR{ID: id, Op: WRSend, Unsignaled: true, SGL: []SGE{{STag: msg.STag(), Len: 16}}}
	}
	var m SQMark
	if a.qp.SendGathered(&m, 0) {
		t.Fatal("a zero mark reports a WR gathered")
	}
	if _, err := a.qp.PostSendMarked(&m, send(1)); err != nil {
		t.Fatal(err)
	}
	b.waitOK(b.rcq, WRRecv) // the stream is open; the first list was sent
	if !a.qp.SendGathered(&m, 0) {
		t.Fatal("a Send the peer received is not reported gathered")
	}
	c := a.stream()
	c.txMu.Lock()
	var once sync.Once
	release := func() { once.Do(c.txMu.Unlock) }
	t.Cleanup(release)
	if _, err := a.qp.PostSendMarked(&m, send(2), send(3)); err != nil {
		t.Fatal(err)
	}
	if a.qp.SendGathered(&m, 0) || a.qp.SendGathered(&m, 1) {
		t.Fatal("WRs the held transmitter cannot have begun are reported gathered")
	}
	release()
	b.waitOK(b.rcq, WRRecv)
	b.waitOK(b.rcq, WRRecv)
	if !a.qp.SendGathered(&m, 0) || !a.qp.SendGathered(&m, 1) {
		t.Fatal("Sends the peer received are not reported gathered")
	}
}

// TestSendGatheredMidSend: a Send the transmitter has begun but not
// gathered in full (it is stuck writing the first part, the peer reading
// nothing) is not reported gathered, nor is the Send after it; once the
// peer reads, both are. A consumer that took "begun" for "done with" would
// rewrite a buffer the transmitter still reads.
func TestSendGatheredMidSend(t *testing.T) {
	const size = 64 << 20 // far more than two loopback socket buffers hold
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}, 0, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	// The Responder sends nothing before the Initiator's first FPDU.
	sendULPDU(t, p, tagged(p, rdmap.OpWrite, 0xDEADBEEF, 0, 0))
	big, _ := tt.reg(size, LocalRead)
	small, _ := tt.reg(16, LocalRead)
	var m SQMark
	if _, err := tt.qp.PostSendMarked(&m,
		SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: big.STag(), Len: size}}},
		SendWR{ID: 2, Op: WRSend, SGL: []SGE{{STag: small.STag(), Len: 16}}}); err != nil {
		t.Fatal(err)
	}
	q := tt.qp.sq
	begun := func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.next != q.head
	}
	for deadline := time.Now().Add(10 * time.Second); !begun(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the transmitter never began the Send")
		}
	}
	// The peer reads nothing: the transmitter cannot get past the
	// socket buffers, a few MiB into the Send.
	if tt.qp.SendGathered(&m, 0) || tt.qp.SendGathered(&m, 1) {
		t.Fatal("a Send the transmitter is still reading is reported gathered")
	}
	go io.Copy(io.Discard, p.Conn)
	for deadline := time.Now().Add(30 * time.Second); !tt.qp.SendGathered(&m, 1); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Sends were never reported gathered")
		}
	}
	if !tt.qp.SendGathered(&m, 0) {
		t.Fatal("the second Send is gathered, the first not")
	}
}

// TestSQResizeKeepsPositions: a resize moves the WQEs to a new ring but
// keeps their positions (what an SQMark names), wrapped cursors included.
func TestSQResizeKeepsPositions(t *testing.T) {
	q := newSendQueue(4, 1, 1)
	// Run the cursors near the 32-bit wrap, then queue three WRs across it.
	q.head, q.next, q.tail = math.MaxUint32-1, math.MaxUint32-1, math.MaxUint32-1
	var m SQMark
	if _, err := q.post([]SendWR{{ID: 10}, {ID: 11}, {ID: 12}}, &m); err != nil {
		t.Fatal(err)
	}
	q.next++ // the first has started
	for _, depth := range []int{16, 3} {
		if err := q.resize(depth); err != nil {
			t.Fatal(err)
		}
		first := uint32(m.pos.Load() - 1)
		for i := range 3 {
			if id := q.at(first + uint32(i)).wr.ID; id != uint64(10+i) {
				t.Fatalf("after a resize to %d, position %d holds WR %d, want %d", depth, first+uint32(i), id, 10+i)
			}
		}
		if q.next != first+1 || q.tail != first+3 {
			t.Fatalf("after a resize to %d the cursors moved: next %d tail %d, first %d", depth, q.next, q.tail, first)
		}
	}
}
