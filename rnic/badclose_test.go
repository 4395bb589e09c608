package rnic

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// TestBadCloseLocal: Modify QP RTS->Closing with a WQE still on the SQ is
// a Bad Close (draft T17): the stream is reset, the WQE flushed, the QP
// moves to Error and raises "Bad Close". The peer, in RTS, sees the reset.
func TestBadCloseLocal(t *testing.T) {
	a, b, release := sendLeftOnSQ(t, 7)
	if err := a.qp.Modify(StateClosing, ModifyAttrs{}); err != nil {
		t.Fatalf("modify to Closing: %v", err)
	}
	release()
	a.waitEvent(EventBadClose)
	a.waitState(StateError)
	if wc := a.wait(a.scq); wc.ID != 7 || wc.Status != StatusFlushed {
		t.Fatalf("the Send left on the SQ completed %+v, want Flushed", wc)
	}
	b.waitEvent(EventLLPConnectionReset)
	b.waitState(StateError)
	if q := b.qp.Query(); q.Terminate != nil {
		t.Fatalf("a reset, not a Terminate, ends a Bad Close: peer holds %+v", q.Terminate)
	}
}

// TestBadLLPClose: the peer closes (FIN) while our SQ still holds a WQE:
// Bad LLP Close (draft T12). We send a Terminate RDMAP / Remote Operation /
// Catastrophic Error localized to the stream (0x0207), raise "Bad LLP
// Close", flush the WQE and end in Error. The peer, in Closing, gets a
// segment (the Terminate) instead of a FIN: T17 resets the stream and moves
// it to Error with "Bad Close" (the draft's MAY; the Terminate it MAY keep
// for Query QP is not parsed: any segment in Closing ends the stream).
func TestBadLLPClose(t *testing.T) {
	a, b, release := sendLeftOnSQ(t, 9)
	if err := b.qp.Modify(StateClosing, ModifyAttrs{}); err != nil {
		t.Fatalf("peer modify to Closing: %v", err)
	}
	want := term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpCatastrophicStream}
	ev := a.waitEvent(EventBadLLPClose)
	release() // a is terminating: its transmitter sends the Terminate, not the Send
	if ev.Terminate == nil || !ev.TerminateSent || ev.Terminate.Cause != want {
		t.Fatalf("Bad LLP Close event %+v, want our Terminate %v", ev, want)
	}
	a.waitState(StateError)
	if wc := a.wait(a.scq); wc.ID != 9 || wc.Status != StatusFlushed {
		t.Fatalf("the Send left on the SQ completed %+v, want Flushed", wc)
	}
	b.waitEvent(EventBadClose)
	b.waitState(StateError)
}

// closingTarget connects a raw peer to a target QP, opens the stream with
// one Send, then moves the target to Closing and waits for its FIN.
func closingTarget(t *testing.T) (*termTarget, *rawpeer.Peer) {
	tt := newTermTarget(t, QPConfig{}, 1, 64)
	p := tt.dial(t, rawpeer.Options{})
	sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, []byte("hello")))
	tt.waitOK(tt.rcq, WRRecv)
	if err := tt.qp.Modify(StateClosing, ModifyAttrs{}); err != nil {
		t.Fatalf("modify to Closing: %v", err)
	}
	if _, err := p.ReadULPDU(5 * time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("waiting for the target's FIN: %v", err)
	}
	return tt, p
}

// TestBadCloseSegmentWhileClosing: a segment other than a Terminate that
// arrives in Closing is a Bad Close (draft T17): the stream is reset (no
// Terminate), nothing is placed, the QP ends in Error with "Bad Close".
func TestBadCloseSegmentWhileClosing(t *testing.T) {
	tt, p := closingTarget(t)
	before := bytes.Clone(tt.bufs["w"])
	sendULPDU(t, p, tagged(p, rdmap.OpWrite, tt.w.STag(), 0, 8))
	tt.waitEvent(EventBadClose)
	tt.waitState(StateError)
	peerSawReset(t, p)
	if !bytes.Equal(tt.bufs["w"], before) {
		t.Fatal("a Write that arrived in Closing was placed")
	}
}

// TestBadCloseTimeout: a peer that never answers our FIN is a Bad Close
// once Config.CloseTimeout has passed (draft T17, final close timeout):
// the stream is reset and the QP ends in Error.
func TestBadCloseTimeout(t *testing.T) {
	tt, p := closingTarget(t)
	start := time.Now()
	tt.waitEvent(EventBadClose)
	tt.waitState(StateError)
	if waited := time.Since(start); waited < tt.dev.cfg.CloseTimeout/2 {
		t.Fatalf("Bad Close after %v, before the close timeout %v", waited, tt.dev.cfg.CloseTimeout)
	}
	peerSawReset(t, p)
}

// peerSawReset checks that the target reset the stream: after our FIN the
// peer's reads only see EOF, but its first write fails once the reset has
// arrived (EPIPE in CLOSE_WAIT, ECONNRESET otherwise). After a clean close
// the first write would still be accepted.
func peerSawReset(t *testing.T, p *rawpeer.Peer) {
	t.Helper()
	err := p.SendRaw(make([]byte, 16))
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the peer's write after the close: %v, want a reset's EPIPE or ECONNRESET", err)
	}
}

// sendLeftOnSQ connects a pair and leaves a Send (WR id) on a's SQ. One
// Send from a to b completes first, so that the stream is open; then the
// test holds a's transmit lock (txMu) while it posts the second Send, which
// stays queued: neither the poster (it only sends inline when the lock is
// free) nor the transmit goroutine (it blocks on the lock) can send it.
// A Plug would not do: it only delays, and the transmit goroutine, still
// looping after the first Send's completion, may pick the WR up.
//
// The caller calls release once its QP has left RTS: the transmitter then
// finds the stream aborted or terminating and sends no Send. release is
// also called when the test ends.
func sendLeftOnSQ(t *testing.T, id uint64) (a, b *side, release func()) {
	var bRecv *MR
	a, b = newPair(t, pairOpts{}, func(a, b *side) {
		bRecv, _ = b.reg(64, LocalWrite)
		b.postRecv(1, bRecv, 64)
	})
	msg, _ := a.reg(16, LocalRead)
	a.post(SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 16}}})
	a.waitOK(a.scq, WRSend)
	b.waitOK(b.rcq, WRRecv)
	c := a.stream()
	c.txMu.Lock()
	var once sync.Once
	release = func() { once.Do(c.txMu.Unlock) }
	t.Cleanup(release)
	a.post(SendWR{ID: id, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: 16}}})
	return a, b, release
}

// TestBadCloseSendAsClosing: a Send whose header is still arriving when the
// QP moves to Closing is a segment in Closing (Bad Close: reset, no
// Terminate), not a Send without a receive. Modify QP to Closing flushes
// the RQ; the receive loop had already checked the state when the FPDU's
// length arrived, then found the RQ empty and answered with a Terminate
// "DDP / Untagged / no buffer", which the peer read as its own fault. The
// test sends the MPA length first and gives the receive loop time to pass
// its state check; should the loop be slower, it sees Closing there, and
// the outcome asked for is the same.
func TestBadCloseSendAsClosing(t *testing.T) {
	tt := newTermTarget(t, QPConfig{}, 2, 64)
	p := tt.dial(t, rawpeer.Options{})
	sendLateAsClosing(t, tt.side, p)
	tt.waitEvent(EventBadClose)
	tt.waitState(StateError)
	if wc := tt.wait(tt.rcq); wc.ID != 1 || wc.Status != StatusFlushed {
		t.Fatalf("the receive left posted completed %+v, want Flushed", wc)
	}
	for _, typ := range tt.eventTypes() {
		if typ == EventRQInvalidMSN {
			t.Fatalf("a Send in Closing raised %s (events %v)", typ, tt.eventTypes())
		}
	}
	if q := tt.qp.Query(); q.Terminate != nil {
		t.Fatalf("a Send in Closing was answered with a Terminate: %+v", q.Terminate)
	}
	peerSawReset(t, p)
}

// TestBadCloseSendAsClosingSRQ is TestBadCloseSendAsClosing on a QP whose
// receives come from an S-RQ. Modify QP to Closing does not flush an
// S-RQ (it is shared), so the Send whose header was being read as the QP
// entered Closing found a receive and was delivered, in Closing, after
// our FIN. (Found by review, with this test.)
func TestBadCloseSendAsClosingSRQ(t *testing.T) {
	tt := newTermTargetOn(t, pairOpts{srq: true}, 2, 64)
	p := tt.dial(t, rawpeer.Options{})
	s := tt.side
	sendLateAsClosing(t, s, p)
	s.waitEvent(EventBadClose) // on the segment, or at the close timeout
	var wcs [4]WC
	for _, wc := range wcs[:s.rcq.Poll(wcs[:])] {
		if wc.Status == StatusSuccess {
			t.Fatalf("a Send that arrived after our FIN, in Closing, was delivered: %+v (events %v)", wc, s.eventTypes())
		}
	}
	peerSawReset(t, p)
}

// sendLateAsClosing opens the stream with a Send from p to s, then sends
// a second Send's MPA length, gives s's receive loop time to pass its
// state check, moves s's QP to Closing, waits for its FIN and sends the
// rest of the Send.
func sendLateAsClosing(t *testing.T, s *side, p *rawpeer.Peer) {
	t.Helper()
	sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, []byte("hello")))
	s.waitOK(s.rcq, WRRecv)
	f := p.Frame(p.SendMsg(rdmap.OpSend, 0, []byte("late")))
	if err := p.SendRaw(f[:2]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := s.qp.Modify(StateClosing, ModifyAttrs{}); err != nil {
		t.Fatalf("modify to Closing: %v", err)
	}
	if _, err := p.ReadULPDU(5 * time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("waiting for the target's FIN: %v", err)
	}
	if err := p.SendRaw(f[2:]); err != nil {
		t.Fatal(err)
	}
}
