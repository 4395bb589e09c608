package rnic

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// waitInsideSegment waits until tt's receive waits for the rest of a
// segment's payload.
func waitInsideSegment(t *testing.T, tt *termTarget) {
	t.Helper()
	c := tt.stream()
	for deadline := time.Now().Add(10 * time.Second); c.placeWaits.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the receive never waited inside the segment")
		}
	}
}

// TestStalledPeerHoldsNoRegion: a peer that sends part of a segment's
// payload and stalls does not keep the region the segment is placed in
// locked. The consumer's Invalidate of the region returns while the peer
// is stalled; the rest of the segment, when it comes, is refused with the
// Terminate of a segment to an invalid STag, and none of its bytes land in
// the region. For an RDMA Write (a tagged region) and a Send (the buffer
// of a posted receive).
func TestStalledPeerHoldsNoRegion(t *testing.T) {
	const size, first = 2048, 1000
	payload := bytes.Repeat([]byte{0xEE}, size)
	for _, tc := range []struct {
		name   string
		recvs  int
		region func(tt *termTarget) (*MR, string)
		ulpdu  func(tt *termTarget, p *rawpeer.Peer) []byte
		cause  term.Cause
	}{
		{
			name:   "rdma-write",
			region: func(tt *termTarget) (*MR, string) { return tt.w, "w" },
			ulpdu: func(tt *termTarget, p *rawpeer.Peer) []byte {
				return p.Tagged(rdmap.OpWrite, true, uint32(tt.w.STag()), 0, payload)
			},
			cause: ddpTagged(term.TaggedInvalidSTag),
		},
		{
			name:   "send",
			recvs:  1,
			region: func(tt *termTarget) (*MR, string) { return tt.recv, "recv" },
			ulpdu: func(tt *termTarget, p *rawpeer.Peer) []byte {
				return p.SendMsg(rdmap.OpSend, 0, payload)
			},
			cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}, tc.recvs, size)
			p := tt.dial(t, rawpeer.Options{CRC: true})
			mr, name := tc.region(tt)
			frame := p.Frame(tc.ulpdu(tt, p))
			hdr := len(frame) - size - 4 // MPA length + DDP/RDMAP header; payload, CRC
			if err := p.SendRaw(frame[:hdr+first]); err != nil {
				t.Fatal(err)
			}
			waitInsideSegment(t, tt)
			done := make(chan error, 1)
			go func() { done <- mr.Invalidate() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Invalidate waited for the stalled peer")
			}
			if err := p.SendRaw(frame[hdr+first:]); err != nil {
				t.Fatal(err)
			}
			checkTerminate(t, p, tc.cause)
			closeWrite(p.Conn)
			p.WaitClosed(5 * time.Second)
			tt.waitState(StateError)
			if tc.recvs > 0 {
				if wc := tt.wait(tt.rcq); wc.Status == StatusSuccess {
					t.Fatalf("receive completed %+v", wc)
				}
			}
			// What came before the Invalidate may have been placed; nothing
			// after it was.
			b := tt.bufs[name]
			placed := bytes.IndexByte(b, sentinel)
			if placed < 0 || placed > first {
				t.Fatalf("%d bytes placed, more than the %d sent before the Invalidate", placed, first)
			}
			for i := placed; i < len(b); i++ {
				if b[i] != sentinel {
					t.Fatalf("byte %d placed after the Invalidate", i)
				}
			}
		})
	}
}

// TestResetInsideSegment: a peer that resets the stream while the receive
// waits for the rest of a segment (see TestStalledPeerHoldsNoRegion) ends
// it as an LLP Connection Reset, as a reset seen by a waiting read does:
// the wait looks at the socket without taking its pending error away.
func TestResetInsideSegment(t *testing.T) {
	const size, first = 2048, 1000
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}, 0, size)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	frame := p.Frame(p.Tagged(rdmap.OpWrite, true, uint32(tt.w.STag()), 0, bytes.Repeat([]byte{0xEE}, size)))
	hdr := len(frame) - size - 4
	if err := p.SendRaw(frame[:hdr+first]); err != nil {
		t.Fatal(err)
	}
	waitInsideSegment(t, tt)
	p.Conn.(*net.TCPConn).SetLinger(0)
	p.Conn.Close()
	tt.waitState(StateError)
	tt.waitEvent(EventLLPConnectionReset)
}
