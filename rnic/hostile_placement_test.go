package rnic

import (
	"bytes"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// readFromPeer connects a raw peer to a termTarget, has the target post an
// RDMA Read of size bytes into tt.w at sinkTO, and returns the peer after
// it has read the Read Request.
func readFromPeer(t *testing.T, sinkTO uint64, size uint32) (*termTarget, *rawpeer.Peer, rdmap.ReadRequest) {
	t.Helper()
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}, 0, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	// The Responder sends nothing before the Initiator's first FPDU.
	sendULPDU(t, p, tagged(p, rdmap.OpWrite, 0xDEADBEEF, 0, 0))
	tt.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: tt.w.STag(), TO: sinkTO, Len: size}, Remote: RemoteAddr{STag: 0x1234, TO: 0}})
	for {
		u, err := p.ReadULPDU(10 * time.Second)
		if err != nil {
			t.Fatalf("no Read Request: %v", err)
		}
		if ddp.IsTagged(u[0]) {
			continue
		}
		h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
		if h.QN() == rdmap.QNReadRequest {
			return tt, p, rdmap.ReadRequest(u[ddp.UntaggedHeaderLen:])
		}
	}
}

// readTerminate returns the cause of the Terminate p receives next.
func readTerminate(t *testing.T, p *rawpeer.Peer) term.Cause {
	t.Helper()
	tm, _, err := p.ReadTerminate(10 * time.Second)
	if err != nil {
		t.Fatalf("no Terminate: %v", err)
	}
	return tm.Cause
}

// checkTerminate fails t unless the Terminate p receives next has cause want.
func checkTerminate(t *testing.T, p *rawpeer.Peer, want term.Cause) {
	t.Helper()
	if got := readTerminate(t, p); got != want {
		t.Fatalf("Terminate cause %s, want %s", got, want)
	}
}

func expectTerminate(t *testing.T, tt *termTarget, p *rawpeer.Peer, want term.Cause) {
	t.Helper()
	checkTerminate(t, p, want)
	closeWrite(p.Conn)
	p.WaitClosed(5 * time.Second)
	tt.waitState(StateError)
	if wc := tt.wait(tt.scq); wc.ID != 1 || wc.Status == StatusSuccess {
		t.Fatalf("Read completed %+v", wc)
	}
}

// TestHostileReadResponse: Read Responses that do not fit the
// outstanding Read are refused before any byte is placed.
func TestHostileReadResponse(t *testing.T) {
	pl := func(n int) []byte { return bytes.Repeat([]byte{0xEE}, n) }
	t.Run("other-stag", func(t *testing.T) {
		tt, p, _ := readFromPeer(t, 0, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, uint32(tt.va.STag()), 0, pl(16)))
		expectTerminate(t, tt, p, ddpTagged(term.TaggedInvalidSTag))
		tt.untouched(t)
	})
	t.Run("wrong-key", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		s := rr.SinkSTag() ^ 1
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, s, 0, pl(16)))
		expectTerminate(t, tt, p, ddpTagged(term.TaggedInvalidSTag))
		tt.untouched(t)
	})
	t.Run("outside-sink", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 16, pl(16)))
		expectTerminate(t, tt, p, ddpTagged(term.TaggedBaseBounds))
		tt.untouched(t)
	})
	t.Run("too-long", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 0, pl(24)))
		expectTerminate(t, tt, p, ddpTagged(term.TaggedBaseBounds))
		tt.untouched(t)
	})
	t.Run("rewind", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 100, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, false, rr.SinkSTag(), 100, pl(8)))
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 96, pl(12)))
		expectTerminate(t, tt, p, ddpTagged(term.TaggedBaseBounds))
		w := tt.bufs["w"]
		for i := range w {
			if (i < 100 || i >= 108) && w[i] != sentinel {
				t.Fatalf("w changed at %d", i)
			}
		}
	})
	t.Run("short-last", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 0, pl(8)))
		t.Logf("short Read Response: Terminate %s", readTerminate(t, p))
		tt.waitState(StateError)
		if wc := tt.wait(tt.scq); wc.ID != 1 || wc.Status == StatusSuccess {
			t.Fatalf("Read completed %+v", wc)
		}
	})
	t.Run("two-responses", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 0, pl(16)))
		if wc := tt.wait(tt.scq); wc.ID != 1 || wc.Status != StatusSuccess {
			t.Fatalf("Read %+v", wc)
		}
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 16, pl(16)))
		checkTerminate(t, p, remoteOp(term.OpUnexpectedOpcode))
		w := tt.bufs["w"]
		for i := 16; i < len(w); i++ {
			if w[i] != sentinel {
				t.Fatalf("w changed at %d", i)
			}
		}
	})
	t.Run("sink-invalidated-locally", func(t *testing.T) {
		tt, p, rr := readFromPeer(t, 0, 16)
		if err := tt.w.Invalidate(); err != nil {
			t.Fatal(err)
		}
		sendULPDU(t, p, p.Tagged(rdmap.OpReadResponse, true, rr.SinkSTag(), 0, pl(16)))
		checkTerminate(t, p, ddpTagged(term.TaggedInvalidSTag))
		tt.untouched(t)
	})
}

// TestWindowOverTheWire: accesses through memory windows stay
// inside the window (not just the region), and windows bound to another
// QP, unbound or deallocated are refused.
func TestWindowOverTheWire(t *testing.T) {
	const va = 0x10000
	type wcase struct {
		name string
		zb   bool
		acc  Access
		// send returns the expected Terminate cause (zero: none expected;
		// then the write must land at mr offset landAt).
		send   func(tt *termTarget, p *rawpeer.Peer, win STag, qp2 *QP, mw *MW) term.Cause
		landAt int
	}
	pl := bytes.Repeat([]byte{0xEE}, 8)
	cases := []wcase{
		{name: "inside", acc: RemoteWrite, landAt: 1024 + 16, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1024+16, pl))
			return term.Cause{}
		}},
		{name: "inside-zero-based", zb: true, acc: RemoteWrite, landAt: 1024 + 1016, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), 1016, pl))
			return term.Cause{}
		}},
		{name: "crossing-window-end", acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+2048-4, pl))
			return ddpTagged(term.TaggedBaseBounds)
		}},
		{name: "zero-based-crossing-end", zb: true, acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), 1020, pl))
			return ddpTagged(term.TaggedBaseBounds)
		}},
		{name: "below-window", acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1020, pl))
			return ddpTagged(term.TaggedBaseBounds)
		}},
		{name: "no-write-right", acc: RemoteRead, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1024, pl))
			return ddpTagged(term.TaggedInvalidSTag)
		}},
		{name: "other-qp", acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, qp2 *QP, mw *MW) term.Cause {
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1024, pl))
			return ddpTagged(term.TaggedNotAssociated)
		}},
		{name: "read-crossing-end", acc: RemoteRead, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 16, SrcSTag: uint32(win), SrcTO: va + 2048 - 8}))
			return prot(term.ProtBaseBounds)
		}},
		{name: "atomic-at-end", zb: true, acc: RemoteAtomic, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: uint32(win), TO: 1024, AddSwap: 1, CompareMask: ^uint64(0)}))
			return prot(term.ProtBaseBounds)
		}},
		{name: "send-inv-then-write", acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, _ *MW) term.Cause {
			sendULPDU(t, p, p.SendMsg(rdmap.OpSendInv, uint32(win), []byte("x")))
			if wc := tt.wait(tt.rcq); wc.Status != StatusSuccess || !wc.HasInvalidated {
				t.Fatalf("recv %+v", wc)
			}
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1024, pl))
			return ddpTagged(term.TaggedInvalidSTag)
		}},
		{name: "dealloc-then-write", acc: RemoteWrite, send: func(tt *termTarget, p *rawpeer.Peer, win STag, _ *QP, mw *MW) term.Cause {
			if err := mw.Dealloc(); err != nil {
				t.Fatal(err)
			}
			sendULPDU(t, p, p.Tagged(rdmap.OpWrite, true, uint32(win), va+1024, pl))
			return ddpTagged(term.TaggedInvalidSTag)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true, BindMW: true, Privileged: true}, 1, 64)
			buf := bytes.Repeat([]byte{sentinel}, 4096)
			mr, err := tt.pd.RegisterMR(Bytes(buf), MROptions{Access: LocalRead | LocalWrite | MWBind, VA: va})
			if err != nil {
				t.Fatal(err)
			}
			tt.bufs["mwregion"] = buf
			mw, err := tt.pd.AllocMW()
			if err != nil {
				t.Fatal(err)
			}
			bindQP := tt.qp
			var qp2 *QP
			if tc.name == "other-qp" {
				qp2, err = tt.pd.CreateQP(QPConfig{SendCQ: tt.scq, RecvCQ: tt.rcq, BindMW: true})
				if err != nil {
					t.Fatal(err)
				}
				bindQP = qp2
			}
			win := mw.STag().WithKey(0x42)
			if st := tt.dev.bindMW(bindQP, &BindMW{MW: win, MR: mr.STag(), ZeroBased: tc.zb, VA: va + 1024, Len: 1024, Access: tc.acc}); st != StatusSuccess {
				t.Fatalf("bind: %s", st)
			}
			p := tt.dial(t, rawpeer.Options{CRC: true})
			want := tc.send(tt, p, win, qp2, mw)
			if want == (term.Cause{}) {
				// Round trip: a zero-length Read Request answered proves the
				// Write was processed.
				sendULPDU(t, p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1}))
				if _, err := p.ReadULPDU(10 * time.Second); err != nil {
					t.Fatal(err)
				}
				for i, v := range buf {
					in := i >= tc.landAt && i < tc.landAt+8
					if in && v != 0xEE || !in && v != sentinel {
						t.Fatalf("region byte %d = %#x", i, v)
					}
				}
				delete(tt.bufs, "mwregion")
				tt.untouched(t)
				return
			}
			checkTerminate(t, p, want)
			delete(tt.bufs, "recv")
			tt.untouched(t)
		})
	}
}
