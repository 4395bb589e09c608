package rnic

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// termTarget is an engine QP accepting one raw peer, with memory regions
// of every kind a hostile peer may aim at. Every region is filled with a
// sentinel so the test can prove nothing was placed.
type termTarget struct {
	*side
	addr      string
	w         *MR // remote write, zero-based
	r         *MR // remote read
	ro        *MR // local + remote read only
	other     *MR // remote write+read, another PD
	va        *MR // VA-based at 2^64-4096, remote read+write
	atomic    *MR // remote atomic
	shared    *MR // shared region (cannot be invalidated remotely)
	recv      *MR
	bufs      map[string][]byte
	accepted  chan error
	otherPD   *PD
	listenerC func()
}

const sentinel = 0x5A

func newTermTarget(t *testing.T, qc QPConfig, recvs int, recvLen uint32) *termTarget {
	t.Helper()
	return newTermTargetOn(t, pairOpts{qp: qc}, recvs, recvLen)
}

// newTermTargetOn is newTermTarget for a side made with o (with o.srq the
// receives go to the S-RQ).
func newTermTargetOn(t *testing.T, o pairOpts, recvs int, recvLen uint32) *termTarget {
	t.Helper()
	s := newSide(t, "target", o)
	tt := &termTarget{side: s, bufs: map[string][]byte{}, accepted: make(chan error, 1)}
	reg := func(name string, pd *PD, n int, m MROptions) *MR {
		b := bytes.Repeat([]byte{sentinel}, n)
		mr, err := pd.RegisterMR(Bytes(b), m)
		if err != nil {
			t.Fatal(err)
		}
		tt.bufs[name] = b
		return mr
	}
	var err error
	if tt.otherPD, err = s.dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	tt.w = reg("w", s.pd, 4096, MROptions{Access: LocalRead | LocalWrite | RemoteWrite, ZeroBased: true})
	tt.r = reg("r", s.pd, 16<<20, MROptions{Access: LocalRead | RemoteRead, ZeroBased: true})
	tt.ro = reg("ro", s.pd, 4096, MROptions{Access: LocalRead | RemoteRead, ZeroBased: true})
	tt.other = reg("other", tt.otherPD, 4096, MROptions{Access: LocalRead | LocalWrite | RemoteWrite | RemoteRead, ZeroBased: true})
	tt.va = reg("va", s.pd, 4096, MROptions{Access: LocalRead | LocalWrite | RemoteWrite | RemoteRead, VA: math.MaxUint64 - 4095})
	tt.atomic = reg("atomic", s.pd, 64, MROptions{Access: LocalRead | LocalWrite | RemoteAtomic, ZeroBased: true})
	src := reg("sharedsrc", s.pd, 4096, MROptions{Access: LocalRead | LocalWrite | RemoteWrite, ZeroBased: true})
	if tt.shared, err = src.RegisterShared(src.STag(), s.pd, MROptions{Access: LocalRead | LocalWrite | RemoteWrite, ZeroBased: true}); err != nil {
		t.Fatal(err)
	}
	tt.recv = reg("recv", s.pd, int(recvLen)*max(recvs, 1), MROptions{Access: LocalWrite, ZeroBased: true})
	for i := 0; i < recvs; i++ {
		wr := RecvWR{ID: uint64(i), SGL: []SGE{{STag: tt.recv.STag(), TO: uint64(i) * uint64(recvLen), Len: recvLen}}}
		if srq := s.qp.cfg.SRQ; srq != nil {
			_, err = srq.Post(wr)
		} else {
			_, err = s.qp.PostRecv(wr)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tt.addr = l.Addr().String()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := l.Accept(ctx)
		if err != nil {
			tt.accepted <- err
			return
		}
		_, err = req.Accept(ctx, s.qp, AcceptParams{})
		tt.accepted <- err
	}()
	return tt
}

func (tt *termTarget) dial(t *testing.T, o rawpeer.Options) *rawpeer.Peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := rawpeer.Dial(ctx, tt.addr, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-tt.accepted; err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// untouched fails if any registered buffer no longer holds the sentinel.
func (tt *termTarget) untouched(t *testing.T) {
	t.Helper()
	for name, b := range tt.bufs {
		for i, v := range b {
			if v != sentinel {
				t.Fatalf("buffer %s changed at offset %d: %#x", name, i, v)
			}
		}
	}
}

type termCase struct {
	name  string
	qp    QPConfig // zero: everything enabled
	recvs int
	// recvStatus, when set, is the status the first receive completes
	// with (the others are flushed).
	recvStatus Status
	// send sends the offending frames; it returns the ULPDU whose headers
	// the Terminate must echo (nil: no echo expected).
	send  func(tt *termTarget, p *rawpeer.Peer) []byte
	cause term.Cause
	ev    EventType
	// echoRDMA: the 28-byte Read Request header must be echoed too.
	echoRDMA bool
	noEcho   bool
	// placesRecv: the payload lands in the posted receive buffer before
	// the failure is known (CRC, remote invalidation): that buffer is the
	// peer's to write, and its receive completes in error.
	placesRecv bool
}

func tagged(p *rawpeer.Peer, op rdmap.Opcode, stag STag, to uint64, n int) []byte {
	return p.Tagged(op, true, uint32(stag), to, bytes.Repeat([]byte{0xEE}, n))
}

func prot(c term.Code) term.Cause {
	return term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: c}
}
func remoteOp(c term.Code) term.Cause {
	return term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: c}
}
func ddpTagged(c term.Code) term.Cause {
	return term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: c}
}
func ddpUntagged(c term.Code) term.Cause {
	return term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: c}
}

func sendULPDU(t *testing.T, p *rawpeer.Peer, u []byte) []byte {
	if err := p.Send(u); err != nil {
		t.Fatal(err)
	}
	return u
}

var termCases = []termCase{
	{name: "write-unknown-stag", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, 0xDEADBEEF, 0, 8))
		}},
	{name: "write-wrong-key", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			s := tt.w.STag()
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, s.WithKey(s.Key()^1), 0, 8))
		}},
	{name: "write-stag-zero", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, 0, 0, 8))
		}},
	{name: "write-other-pd", cause: ddpTagged(term.TaggedNotAssociated), ev: EventInvalidPD,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.other.STag(), 0, 8))
		}},
	{name: "write-no-remote-write", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventAccessRights,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.ro.STag(), 0, 8))
		}},
	{name: "write-past-end", cause: ddpTagged(term.TaggedBaseBounds), ev: EventBaseBounds,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.w.STag(), 4089, 8))
		}},
	{name: "write-below-base", cause: ddpTagged(term.TaggedBaseBounds), ev: EventBaseBounds,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.va.STag(), math.MaxUint64-4096, 8))
		}},
	{name: "write-to-wrap", cause: ddpTagged(term.TaggedTOWrap), ev: EventWrap,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.va.STag(), math.MaxUint64-3, 8))
		}},
	{name: "write-invalidated", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			if err := tt.w.Invalidate(); err != nil {
				tt.t.Fatal(err)
			}
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.w.STag(), 0, 8))
		}},
	{name: "write-not-enabled", qp: QPConfig{InboundRead: true}, cause: ddpTagged(term.TaggedInvalidSTag), ev: EventWriteNotEnabled,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpWrite, tt.w.STag(), 0, 8))
		}},
	{name: "send-no-receive", cause: ddpUntagged(term.UntaggedNoBuffer), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSend, 0, []byte("hello")))
		}},
	{name: "send-too-long", recvs: 1, recvStatus: StatusBaseBounds, cause: ddpUntagged(term.UntaggedTooLong), ev: EventRQMessageTooLong,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSend, 0, make([]byte, 65)))
		}},
	{name: "invalid-qn", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidQN), ev: EventInvalidQN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpSend, true, 0, 7, 1, 0, []byte("x")))
		}},
	{name: "msn-out-of-window", recvs: 1, cause: ddpUntagged(term.UntaggedMSNRange), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpSend, true, 0, 0, 5, 0, []byte("x")))
		}},
	{name: "mo-gap", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidMO), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpSend, true, 0, 0, 1, 4, []byte("x")))
		}},
	// DDP errors echo the DDP header, Invalid DDP Version included (RFC 5040
	// Figure 10: "DDP ... Yes").
	{name: "ddp-version-tagged", cause: ddpTagged(term.TaggedInvalidVersion), ev: EventInvalidDDPVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := tagged(p, rdmap.OpWrite, tt.w.STag(), 0, 8)
			u[0] &^= 0x03
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "ddp-version-untagged", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidVersion), ev: EventInvalidDDPVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, []byte("x"))
			u[0] = u[0]&^0x03 | 0x02
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "ddp-version-and-opcode", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidVersion), ev: EventInvalidDDPVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.Untagged(rdmap.OpSend, true, 0, 0, 9, 0, []byte("x")) // and a bad MSN
			u[0] &^= 0x03
			u[1] = 0x8C // and opcode 0xC, RV 10b
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	// An untagged segment too short for its 18-byte header: the decoder's
	// 1/2/0x06, the 16 bytes there are echoed, zero-padded to 18.
	{name: "untagged-too-short", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidVersion), ev: EventLLPSegmentSize,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, nil)[:16]
			if err := p.SendRaw(mpa.AppendFPDU(nil, u, nil, p.CRC)); err != nil {
				tt.t.Fatal(err)
			}
			return u
		}},
	// RV 00b is valid (RFC 5040 §4.1, "Both version numbers are valid"):
	// the invalid versions are 10b and 11b, and 00b on RFC 7306 messages.
	{name: "rdmap-version-10b", recvs: 1, cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, []byte("x"))
			u[1] = u[1]&^0xC0 | 0x80
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "rdmap-version-11b", recvs: 1, cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, []byte("x"))
			u[1] |= 0xC0
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "rdmap-version-00b-immediate", recvs: 1, cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpImmediate, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8})
			u[1] &^= 0xC0 // RFC 7306 §4.1: its messages MUST carry RV 01b
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "unknown-opcode", recvs: 1, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, []byte("x"))
			u[1] = u[1]&0xF0 | 0x0C
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "opcode-on-wrong-queue", recvs: 1, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpSend, true, 0, rdmap.QNReadRequest, 1, 0, []byte("x")))
		}},
	{name: "write-untagged", recvs: 1, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpWrite, true, 0, 0, 1, 0, []byte("x")))
		}},
	// Segments with two faults: RFC 5040 §7.2 validates (1) the DDP
	// segment fields, (2) the RDMA opcode, (3) the RDMA version, in this
	// order, and the first failing check is reported.
	{name: "opcode-and-rdmap-version", recvs: 1, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.SendMsg(rdmap.OpSend, 0, []byte("x"))
			u[1] = 0x8C // RV 10b, opcode 0xC
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "write-untagged-and-rdmap-version", recvs: 1, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.Untagged(rdmap.OpWrite, true, 0, 0, 1, 0, []byte("x"))
			u[1] |= 0xC0 // RV 11b
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "msn-and-opcode", recvs: 1, cause: ddpUntagged(term.UntaggedMSNRange), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.Untagged(rdmap.OpSend, true, 0, 0, 5, 0, []byte("x"))
			u[1] = u[1]&0xF0 | 0x0C
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "msn-and-rdmap-version", recvs: 1, cause: ddpUntagged(term.UntaggedMSNRange), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.Untagged(rdmap.OpSend, true, 0, 0, 5, 0, []byte("x"))
			u[1] |= 0xC0
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "mo-and-opcode-on-wrong-queue", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidMO), ev: EventRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpAtomicResponse, true, 0, 0, 1, 4, []byte("x")))
		}},
	{name: "qn-and-opcode", recvs: 1, cause: ddpUntagged(term.UntaggedInvalidQN), ev: EventInvalidQN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.Untagged(rdmap.OpSend, true, 0, 7, 1, 0, []byte("x"))
			u[1] = 0x8C
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "read-request-msn-and-rdmap-version", cause: ddpUntagged(term.UntaggedMSNRange), ev: EventIRRQInvalidMSN,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: 0xDEADBE01})
			u[13] = 9 // MSN 9 on QN 1
			u[1] |= 0xC0
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "read-unknown-source", cause: prot(term.ProtInvalidSTag), ev: EventIRRQInvalidSTag, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 0xAB01, SinkTO: 0x2000, Size: 4096, SrcSTag: 0x12345678, SrcTO: 0x1000}))
		}},
	{name: "read-past-end", cause: prot(term.ProtBaseBounds), ev: EventIRRQBaseBounds, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 4097, SrcSTag: uint32(tt.ro.STag())}))
		}},
	{name: "read-size-max", cause: prot(term.ProtBaseBounds), ev: EventIRRQBaseBounds, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: math.MaxUint32, SrcSTag: uint32(tt.ro.STag())}))
		}},
	{name: "read-no-remote-read", cause: prot(term.ProtAccessRights), ev: EventIRRQAccessRights, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: uint32(tt.w.STag())}))
		}},
	{name: "read-other-pd", cause: prot(term.ProtSTagNotAssociated), ev: EventIRRQInvalidPD, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: uint32(tt.other.STag())}))
		}},
	{name: "read-to-wrap", cause: prot(term.ProtTOWrap), ev: EventIRRQWrap, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 16, SrcSTag: uint32(tt.va.STag()), SrcTO: math.MaxUint64 - 7}))
		}},
	{name: "read-not-enabled", qp: QPConfig{InboundWrite: true}, cause: prot(term.ProtAccessRights), ev: EventReadNotEnabled, echoRDMA: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: uint32(tt.ro.STag())}))
		}},
	{name: "ird-exceeded", qp: QPConfig{IRD: 1, InboundRead: true}, cause: ddpUntagged(term.UntaggedNoBuffer), ev: EventIRRQTooMany,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			// The first 16 MiB response fills the socket while the peer does
			// not read, so the first request is still outstanding.
			sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 16 << 20, SrcSTag: uint32(tt.r.STag())}))
			return sendULPDU(tt.t.(*testing.T), p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 8, SrcSTag: uint32(tt.r.STag())}))
		}},
	{name: "atomic-misaligned", cause: remoteOp(term.OpCatastrophicStream), ev: EventMisalignedAtomic,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: uint32(tt.atomic.STag()), TO: 4, AddSwap: 1, CompareMask: math.MaxUint64}))
		}},
	{name: "atomic-no-rights", cause: prot(term.ProtAccessRights), ev: EventIRRQAccessRights,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: uint32(tt.w.STag()), TO: 8, AddSwap: 1}))
		}},
	{name: "atomic-past-end", cause: prot(term.ProtBaseBounds), ev: EventIRRQBaseBounds,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicCmpSwap, ReqID: 1, STag: uint32(tt.atomic.STag()), TO: 64}))
		}},
	{name: "atomic-bad-aopcode", cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			u := p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: uint32(tt.atomic.STag()), TO: 8})
			u[ddp.UntaggedHeaderLen+3] = 0x01
			return sendULPDU(tt.t.(*testing.T), p, u)
		}},
	{name: "atomics-not-enabled", qp: QPConfig{InboundWrite: true}, cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: uint32(tt.atomic.STag()), TO: 8}))
		}},
	{name: "read-response-unsolicited", cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedResponse,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, tagged(p, rdmap.OpReadResponse, tt.w.STag(), 0, 8))
		}},
	{name: "atomic-response-unsolicited", cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedResponse,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			var b [rdmap.AtomicResponseLen]byte
			return sendULPDU(tt.t.(*testing.T), p, p.Untagged(rdmap.OpAtomicResponse, true, 0, rdmap.QNAtomicResponse, p.NextMSN(rdmap.QNAtomicResponse), 0, b[:]))
		}},
	{name: "immediate-4-bytes", recvs: 1, cause: remoteOp(term.OpUnspecified), ev: EventProtocolError,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpImmediate, 0, []byte{1, 2, 3, 4}))
		}},
	// An Invalidate STag not associated with the stream is "STag Cannot be
	// Invalidated" 0/1/0x09 (RFC 5040 §5.3), not 0x03 "STag not associated".
	{name: "send-inv-other-pd", recvs: 1, placesRecv: true, cause: prot(term.ProtCannotInvalidate), ev: 0,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSendInv, uint32(tt.other.STag()), []byte("x")))
		}},
	{name: "send-inv-other-pd-window", recvs: 1, placesRecv: true, cause: prot(term.ProtCannotInvalidate), ev: 0,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			mw, err := tt.otherPD.AllocMW()
			if err != nil {
				tt.t.Fatal(err)
			}
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSendInv, uint32(mw.STag()), []byte("x")))
		}},
	{name: "send-inv-unknown", recvs: 1, placesRecv: true, cause: prot(term.ProtInvalidSTag), ev: 0,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSendSEInv, 0xDEADBE01, []byte("x")))
		}},
	{name: "send-inv-shared", recvs: 1, placesRecv: true, cause: prot(term.ProtCannotInvalidate), ev: 0,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			return sendULPDU(tt.t.(*testing.T), p, p.SendMsg(rdmap.OpSendInv, uint32(tt.shared.STag()), []byte("x")))
		}},
	{name: "bad-crc", recvs: 1, placesRecv: true, cause: term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPACRC}, ev: EventLLPInvalidCRC, noEcho: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			if err := p.SendBadCRC(p.SendMsg(rdmap.OpSend, 0, []byte("hello"))); err != nil {
				tt.t.Fatal(err)
			}
			return nil
		}},
	{name: "ulpdu-too-short", cause: term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPAMarker}, ev: EventLLPBadFPDU, noEcho: true,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			if err := p.SendRaw(mpa.AppendFPDU(nil, []byte{0x41, 0x43, 0, 0}, nil, true)); err != nil {
				tt.t.Fatal(err)
			}
			return nil
		}},
	{name: "first-error-wins", cause: ddpTagged(term.TaggedInvalidSTag), ev: EventInvalidSTag,
		send: func(tt *termTarget, p *rawpeer.Peer) []byte {
			first := tagged(p, rdmap.OpWrite, 0xDEADBEEF, 0, 8)
			second := tagged(p, rdmap.OpWrite, tt.other.STag(), 0, 8)
			if err := p.SendRaw(append(mpa.AppendFPDU(nil, first, nil, p.CRC), mpa.AppendFPDU(nil, second, nil, p.CRC)...)); err != nil {
				tt.t.Fatal(err)
			}
			return first
		}},
}

// TestTerminateCodes sends each class of malformed or forbidden frame from
// a raw peer and checks the exact Terminate on the wire, the target's
// asynchronous event, its QP state, and that no memory was touched.
func TestTerminateCodes(t *testing.T) {
	for _, tc := range termCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			qc := tc.qp
			if qc == (QPConfig{}) {
				qc = QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}
			}
			tt := newTermTarget(t, qc, tc.recvs, 64)
			p := tt.dial(t, rawpeer.Options{CRC: true})
			off := tc.send(tt, p)
			tm, _, err := p.ReadTerminate(10 * time.Second)
			if err != nil {
				t.Fatalf("no Terminate: %v", err)
			}
			if tm.Cause != tc.cause {
				t.Fatalf("Terminate cause %s, want %s (%x)", tm.Cause, tc.cause, tm.Raw)
			}
			if tm.MSN != 1 {
				t.Errorf("Terminate MSN %d, want 1", tm.MSN)
			}
			checkEcho(t, tc, tm, off)
			closeWrite(p.Conn)
			if err := p.WaitClosed(5 * time.Second); err != nil {
				t.Errorf("target did not close after its Terminate: %v", err)
			}
			tt.waitState(StateError)
			info := tt.qp.Query()
			if info.Terminate == nil || !info.TerminateSent || info.Terminate.Cause != tc.cause {
				t.Errorf("Query QP terminate %+v", info.Terminate)
			}
			if tc.ev != 0 {
				ev := tt.waitEvent(tc.ev)
				if ev.QPID != tt.qp.ID() || ev.Terminate == nil || ev.Terminate.Cause != tc.cause {
					t.Errorf("event %+v", ev)
				}
			}
			if tc.recvs > 0 {
				// The receives are completed: with an error status for
				// remote-invalidate failures, flushed otherwise.
				wcs := drainCQ(tt.rcq)
				if len(wcs) != tc.recvs {
					t.Fatalf("%d receive completions, want %d: %+v", len(wcs), tc.recvs, wcs)
				}
				for i, wc := range wcs {
					if wc.Status == StatusSuccess {
						t.Errorf("receive completed successfully: %+v", wc)
					}
					if i == 0 && tc.recvStatus != StatusSuccess && wc.Status != tc.recvStatus {
						t.Errorf("receive completed %s, want %s: %+v", wc.Status, tc.recvStatus, wc)
					}
				}
			}
			if tc.placesRecv {
				delete(tt.bufs, "recv")
			}
			tt.untouched(t)
		})
	}
}

func checkEcho(t *testing.T, tc termCase, tm *rawpeer.Terminate, off []byte) {
	t.Helper()
	if tc.noEcho || off == nil {
		if tm.D || tm.R {
			t.Errorf("unexpected echoed headers: %x", tm.Raw)
		}
		return
	}
	hl := ddp.UntaggedHeaderLen
	if ddp.IsTagged(off[0]) {
		hl = ddp.TaggedHeaderLen
	}
	if !tm.M || !tm.D {
		t.Fatalf("M/D not set: %x", tm.Raw)
	}
	if int(tm.SegLen) != len(off) {
		t.Errorf("DDP segment length %d, want %d", tm.SegLen, len(off))
	}
	// A segment shorter than its header is echoed zero-padded.
	want := append(bytes.Clone(off[:min(hl, len(off))]), make([]byte, max(0, hl-len(off)))...)
	if !bytes.Equal(tm.DDPHeader, want) {
		t.Errorf("echoed DDP header\n got %x\nwant %x", tm.DDPHeader, want)
	}
	if tc.echoRDMA {
		if !tm.R || !bytes.Equal(tm.RDMAHeader, off[hl:hl+rdmap.ReadRequestLen]) {
			t.Errorf("echoed RDMA header R=%v %x, want %x", tm.R, tm.RDMAHeader, off[hl:hl+rdmap.ReadRequestLen])
		}
	} else if tm.R {
		t.Errorf("R set without a Read Request: %x", tm.Raw)
	}
}

// TestTerminateVector18 checks the engine's Terminate for an invalid
// source STag of a Read Request byte for byte against a known answer: RDMA
// / Remote Protection / Invalid STag with M, D and R, the Read Request's DDP
// and RDMA headers echoed (RFC 5040 §4.8).
func TestTerminateVector18(t *testing.T) {
	tt := newTermTarget(t, QPConfig{InboundRead: true}, 0, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	sendULPDU(t, p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 0xAB01, SinkTO: 0x2000, Size: 4096, SrcSTag: 0x12345678, SrcTO: 0x1000}))
	tm, _, err := p.ReadTerminate(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := `00 46 41 47 00 00 00 00 00 00 00 02 00 00 00 01
		00 00 00 00 01 00 e0 00 00 2e 41 41 00 00 00 00
		00 00 00 01 00 00 00 01 00 00 00 00 00 00 ab 01
		00 00 00 00 00 00 20 00 00 00 10 00 12 34 56 78
		00 00 00 00 00 00 10 00 cf e2 11 9e`
	wb, err := hex.DecodeString(strings.Join(strings.Fields(want), ""))
	if err != nil {
		t.Fatal(err)
	}
	got := mpa.AppendFPDU(nil, tm.Raw, nil, true)
	if !bytes.Equal(got, wb) {
		t.Fatalf("Terminate FPDU\n got %x\nwant %x", got, wb)
	}
}

// TestZeroLengthWriteNotValidated: a zero-length Write names an unknown
// STag and is accepted (RFC 5040 §5.1); the stream stays up.
func TestZeroLengthWriteNotValidated(t *testing.T) {
	tt := newTermTarget(t, QPConfig{InboundWrite: true}, 1, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	sendULPDU(t, p, tagged(p, rdmap.OpWrite, 0xDEADBEEF, math.MaxUint64, 0))
	sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, []byte("after")))
	wc := tt.waitOK(tt.rcq, WRRecv)
	if wc.Bytes != 5 || string(tt.bufs["recv"][:5]) != "after" {
		t.Fatalf("receive %+v %q", wc, tt.bufs["recv"][:5])
	}
	if st := tt.qp.State(); st != StateRTS {
		t.Fatalf("state %s", st)
	}
}

// TestRDMAPVersion00Accepted: RV 00b (the RDMA Consortium's RDMAP) is valid
// on receive, RFC 5040 §4.1 "Both version numbers are valid": a Send, a
// Write and a Read Request with RV 00b are served, and the Read Response
// goes out with RV 01b.
func TestRDMAPVersion00Accepted(t *testing.T) {
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true}, 1, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	rv0 := func(u []byte) []byte { u[1] &^= 0xC0; return u }
	sendULPDU(t, p, rv0(tagged(p, rdmap.OpWrite, tt.w.STag(), 16, 8)))
	sendULPDU(t, p, rv0(p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 0xAB01, SinkTO: 0x2000, Size: 4, SrcSTag: uint32(tt.ro.STag())})))
	sendULPDU(t, p, rv0(p.SendMsg(rdmap.OpSend, 0, []byte("rv00b"))))
	wc := tt.waitOK(tt.rcq, WRRecv)
	if wc.Bytes != 5 || string(tt.bufs["recv"][:5]) != "rv00b" {
		t.Fatalf("receive %+v %q", wc, tt.bufs["recv"][:5])
	}
	if !bytes.Equal(tt.bufs["w"][16:24], bytes.Repeat([]byte{0xEE}, 8)) {
		t.Fatalf("Write with RV 00b not placed: %x", tt.bufs["w"][16:24])
	}
	u, err := p.ReadULPDU(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(u) != ddp.TaggedHeaderLen+4 || u[1] != rdmap.Ctrl(rdmap.OpReadResponse) || ddp.Tagged(u).STag() != 0xAB01 {
		t.Fatalf("Read Response %x", u)
	}
	if st := tt.qp.State(); st != StateRTS {
		t.Fatalf("state %s", st)
	}
}

// TestSendInvWindowOfAnotherQP: a Send with Invalidate naming a window
// bound to another QP (same PD) is refused with "STag Cannot be
// Invalidated" 0/1/0x09, RFC 5040 §5.3 ("issue a Terminate Message with the
// STag Cannot be Invalidated Terminate Error Code, if the STag is not
// associated with the RDMAP Stream"), and the window stays bound.
func TestSendInvWindowOfAnotherQP(t *testing.T) {
	_, b := newPair(t, pairOpts{}, nil)
	mr, err := b.pd.RegisterMR(Bytes(make([]byte, 4096)), MROptions{Access: LocalRead | LocalWrite | MWBind, VA: 0x10000})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := b.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	win := mw.STag().WithKey(b.dev.RandomKey())
	b.post(SendWR{ID: 1, Op: WRBindMW, Bind: &BindMW{MW: win, MR: mr.STag(), ZeroBased: true, VA: 0x10000, Len: 4096, Access: RemoteWrite}})
	b.waitOK(b.scq, WRBindMW)

	// A second QP of the same device and PD, driven by a raw peer.
	qp2, err := b.pd.CreateQP(QPConfig{SendCQ: b.scq, RecvCQ: b.rcq, IRD: 4, ORD: 4, InboundWrite: true, InboundRead: true})
	if err != nil {
		t.Fatal(err)
	}
	recv, _ := b.reg(64, LocalWrite)
	if _, err := qp2.PostRecv(RecvWR{ID: 7, SGL: []SGE{{STag: recv.STag(), Len: 64}}}); err != nil {
		t.Fatal(err)
	}
	l, err := b.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			_, err = req.Accept(ctx, qp2, AcceptParams{})
		}
		accepted <- err
	}()
	p, err := rawpeer.Dial(ctx, l.Addr().String(), rawpeer.Options{CRC: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	u := sendULPDU(t, p, p.SendMsg(rdmap.OpSendInv, uint32(win), []byte("x")))
	tm, _, err := p.ReadTerminate(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := prot(term.ProtCannotInvalidate); tm.Cause != want {
		t.Fatalf("Terminate cause %s, want %s (%x)", tm.Cause, want, tm.Raw)
	}
	if !tm.D || !bytes.Equal(tm.DDPHeader, u[:ddp.UntaggedHeaderLen]) {
		t.Fatalf("echoed header %x", tm.Raw)
	}
	if info, _ := mw.Query(); !info.Valid || info.QPID != b.qp.ID() {
		t.Fatalf("window after the refused remote invalidate: %+v", info)
	}
	if wc := b.wait(b.rcq); wc.ID != 7 || wc.Status != StatusInvalidateFailed {
		t.Fatalf("receive completion %+v", wc)
	}
}

// TestTerminateBlamesTheRightWR: a received Terminate completes the WR it
// concerns (found by the echoed DDP header: QN 1 and its MSN) with Remote
// Termination Error; every other outstanding WR is Flushed, the oldest
// outstanding Read or atomic included.
//
// The big Read must still be outstanding when the Terminate arrives: a
// relay holds the Responder's bytes after 1 MiB until the Responder has
// found the fault, and the Responder stops its Read Response at the next
// segment once it has.
func TestTerminateBlamesTheRightWR(t *testing.T) {
	const big = 16 << 20
	// outstanding connects a pair through a relay that holds b's bytes
	// after 1 MiB, and returns the big Read (WR 1) to keep outstanding.
	outstanding := func(t *testing.T) (a, b *side, px *proxy, read SendWR) {
		a, b = newPair(t, pairOpts{proxy: &px}, nil)
		src, _ := b.reg(big, LocalRead|RemoteRead)
		sink, _ := a.reg(big, LocalWrite|RemoteWrite)
		px.hold(1 << 20)
		return a, b, px, SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: big}, Remote: RemoteAddr{STag: src.STag()}}
	}
	t.Run("second-read", func(t *testing.T) {
		a, b, px, read := outstanding(t)
		sink, src := read.Local.STag, read.Remote.STag
		// One list: the Terminate may come back before a later PostSend.
		if n, err := a.qp.PostSend(read,
			SendWR{ID: 2, Op: WRRead, Local: SGE{STag: sink, Len: 16}, Remote: RemoteAddr{STag: src.WithKey(src.Key() ^ 1)}},
			SendWR{ID: 3, Op: WRRead, Local: SGE{STag: sink, Len: 16}, Remote: RemoteAddr{STag: src}}); n != 3 || err != nil {
			t.Fatalf("posted %d: %v", n, err)
		}
		b.waitEvent(EventIRRQInvalidSTag)
		px.unhold()
		for _, want := range []struct {
			id uint64
			st Status
		}{{1, StatusFlushed}, {2, StatusRemoteTermination}, {3, StatusFlushed}} {
			if wc := a.wait(a.scq); wc.ID != want.id || wc.Status != want.st {
				t.Fatalf("completion %+v, want WR %d %s", wc, want.id, want.st)
			}
		}
		ev := a.waitEvent(EventTerminateReceived)
		if ev.Terminate.Cause != prot(term.ProtInvalidSTag) {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("write-with-read-outstanding", func(t *testing.T) {
		a, b, px, read := outstanding(t)
		wsrc, _ := a.reg(64, LocalRead)
		a.post(read)
		a.post(SendWR{ID: 2, Op: WRWrite, SGL: []SGE{{STag: wsrc.STag(), Len: 64}}, Remote: RemoteAddr{STag: 0x00ABCD01}})
		b.waitEvent(EventInvalidSTag)
		px.unhold()
		if wc := a.wait(a.scq); wc.ID != 1 || wc.Status != StatusFlushed {
			t.Fatalf("the Read the Terminate does not concern: %+v", wc)
		}
		if wc := a.wait(a.scq); wc.ID != 2 || wc.Status != StatusSuccess {
			t.Fatalf("the Write (handed to TCP before the Terminate): %+v", wc)
		}
		if ev := a.waitEvent(EventTerminateReceived); ev.Terminate.Cause != ddpTagged(term.TaggedInvalidSTag) {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("second-atomic", func(t *testing.T) {
		a, b, px, read := outstanding(t)
		word, _ := b.reg(64, LocalWrite|RemoteAtomic)
		res, _ := a.reg(16, LocalWrite)
		a.post(read)
		a.post(SendWR{ID: 2, Op: WRFetchAdd, Local: SGE{STag: res.STag(), Len: 8}, Remote: RemoteAddr{STag: word.STag(), TO: 4}, AddSwap: 1})
		b.waitEvent(EventMisalignedAtomic)
		px.unhold()
		if wc := a.wait(a.scq); wc.ID != 1 || wc.Status != StatusFlushed {
			t.Fatalf("read %+v", wc)
		}
		if wc := a.wait(a.scq); wc.ID != 2 || wc.Status != StatusRemoteTermination {
			t.Fatalf("misaligned atomic %+v", wc)
		}
	})
}

// holdTransmitter waits until the Responder's transmitter has started (its
// Read Response to p's Read Request is here), then takes its lock, so that
// it sends nothing until release (which the test's end calls too).
func holdTransmitter(t *testing.T, tt *termTarget, p *rawpeer.Peer) (c *conn, release func()) {
	t.Helper()
	sendULPDU(t, p, p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1}))
	if _, err := p.ReadULPDU(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	c = tt.stream()
	c.txMu.Lock()
	var unlock sync.Once
	release = func() { unlock.Do(c.txMu.Unlock) }
	t.Cleanup(release)
	return c, release
}

// TestNoTerminateAfterTerminateReceived: a local fault between the receipt
// of the peer's Terminate and the end of the stream sends no Terminate of
// ours (the draft's T11: a received Terminate gets no reply) and leaves
// the peer's as the QP's Terminate (Query QP: received, not sent).
//
// The fault is a Send whose SGE names no region. It is posted under a
// Plug while the test holds the transmitter's lock, so that nothing takes
// it early. The peer sends a Send and its Terminate in one write: the
// receive reads both in one batch and moves the QP to Terminate, and at
// the batch's end (still before it ends the stream) runs the receive CQ's
// direct handler for the Send's completion. That handler releases the
// transmitter and unplugs: the bad Send fails there, in the window.
func TestNoTerminateAfterTerminateReceived(t *testing.T) {
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true}, 1, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	c, release := holdTransmitter(t, tt, p)
	tt.qp.Plug()
	tt.post(SendWR{ID: 9, Op: WRSend, SGL: []SGE{{STag: 0x00BAD001, Len: 8}}})
	var once sync.Once
	var inWindow QPState
	tt.rcq.SetDirectHandler(func() bool {
		once.Do(func() {
			inWindow = tt.qp.State()
			release()
			tt.qp.Unplug()
			// The bad Send fails now (here, inline, or on the transmit
			// goroutine), unless the transmitter has stopped.
			for deadline := time.Now().Add(10 * time.Second); tt.scq.Len() == 0 && time.Now().Before(deadline); {
				select {
				case <-c.txDone:
					return
				case <-time.After(100 * time.Microsecond):
				}
			}
			// The window stays open until the transmitter has done what
			// the fault made it do: the pass that failed the Send is over
			// once its lock is free, and a stream set to send a Terminate
			// sends it and stops.
			c.txMu.Lock()
			c.txMu.Unlock()
			if txMode(c.mode.Load()) == txTerminate {
				select {
				case <-c.txDone:
				case <-time.After(10 * time.Second):
				}
			}
		})
		return true
	})
	peerCause := remoteOp(term.OpUnspecified)
	body := rdmap.AppendTerminate(nil, &rdmap.TerminateFields{Cause: peerCause})
	tu := p.Untagged(rdmap.OpTerminate, true, 0, rdmap.QNTerminate, p.NextMSN(rdmap.QNTerminate), 0, body)
	if err := p.SendRaw(append(p.Frame(p.SendMsg(rdmap.OpSend, 0, []byte("x"))), p.Frame(tu)...)); err != nil {
		t.Fatal(err)
	}
	tm, _, err := p.ReadTerminate(10 * time.Second)
	closeWrite(p.Conn)
	tt.waitState(StateError)
	if inWindow != StateTerminate {
		t.Fatalf("the direct handler ran in %s, not in Terminate: the Send and the Terminate were read in two batches", inWindow)
	}
	if err == nil {
		t.Errorf("a Terminate (%s) answered the peer's", tm.Cause)
	} else if err != rawpeer.ErrNoTerminate {
		t.Errorf("reading the stream: %v", err)
	}
	if info := tt.qp.Query(); info.Terminate == nil || info.TerminateSent || info.Terminate.Cause != peerCause {
		t.Errorf("Query QP: Terminate %+v sent=%v, want the peer's (%s) received", info.Terminate, info.TerminateSent, peerCause)
	}
	if wcs := drainCQ(tt.scq); len(wcs) != 1 || wcs[0].ID != 9 || wcs[0].Status == StatusSuccess {
		t.Errorf("send completions %+v, want WR 9 in error", wcs)
	}
	tt.waitEvent(EventTerminateReceived)
}

// TestLocalTerminateBeforeReceivedOne: a local error recorded while the
// peer's Terminate is being read (after the receive checked the QP's state
// at that FPDU's start, before it acts on it) is the stream's first error:
// our Terminate still goes out (draft §6.2.3: the RNIC MUST attempt to send
// it unless the Terminate state was entered on a received one), Query QP
// reports ours as sent (the QP holds one Terminate, the first), and the
// peer's, a segment arriving in Terminate, is not processed (draft Fig. 9:
// ignored; no Terminate Message Received event).
//
// The peer writes a Send and all of its Terminate but the last body bytes.
// The receive completes the Send, begins the Terminate, and at the read
// for the rest ends its batch: the receive CQ's direct handler moves the
// QP to Terminate there (Modify QP), while the test holds the
// transmitter's lock so that our Terminate waits. The peer then sends the
// rest; once the receive has acted on it (the transmitter set silent, or
// the engine's log saying the Terminate was not processed) the
// transmitter is let go.
func TestLocalTerminateBeforeReceivedOne(t *testing.T) {
	const ignored = "Terminate received after the stream failed: not processed"
	logged := make(chan struct{}, 1)
	log := slog.New(messageHandler{msg: ignored, ch: logged})
	tt := newTermTargetOn(t, pairOpts{qp: QPConfig{InboundRead: true, InboundWrite: true}, cfg: Config{Logger: log}}, 1, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	c, release := holdTransmitter(t, tt, p)
	handled := make(chan struct{})
	var once sync.Once
	var midFPDU bool
	var modErr error
	tt.rcq.SetDirectHandler(func() bool {
		once.Do(func() {
			midFPDU = !c.rd.Idle() // on the receive goroutine: no race
			modErr = tt.qp.Modify(StateTerminate, ModifyAttrs{})
			close(handled)
		})
		return true
	})
	peerCause := remoteOp(term.OpUnspecified)
	body := rdmap.AppendTerminate(nil, &rdmap.TerminateFields{Cause: peerCause})
	tu := p.Untagged(rdmap.OpTerminate, true, 0, rdmap.QNTerminate, p.NextMSN(rdmap.QNTerminate), 0, body)
	tf := p.Frame(tu)
	cut := mpa.HeaderLen + ddp.UntaggedHeaderLen + 2
	if err := p.SendRaw(append(p.Frame(p.SendMsg(rdmap.OpSend, 0, []byte("x"))), tf[:cut]...)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("the Send's completion never reached the direct handler")
	}
	if modErr != nil {
		t.Fatalf("Modify QP to Terminate: %v", modErr)
	}
	if !midFPDU {
		t.Fatal("the direct handler ran between FPDUs: the Send and the Terminate's first bytes were read apart")
	}
	if err := p.SendRaw(tf[cut:]); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
acted:
	for txMode(c.mode.Load()) != txSilent {
		select {
		case <-logged:
			break acted
		case <-deadline:
			t.Fatal("the receive never acted on the peer's Terminate")
		case <-time.After(100 * time.Microsecond):
		}
	}
	release()
	tm, _, err := p.ReadTerminate(10 * time.Second)
	closeWrite(p.Conn)
	tt.waitState(StateError)
	if err != nil {
		t.Errorf("reading our Terminate: %v", err)
	} else if tm.Cause != localCatastrophic.Cause {
		t.Errorf("Terminate sent with cause %s, want %s", tm.Cause, localCatastrophic.Cause)
	}
	if info := tt.qp.Query(); info.Terminate == nil || !info.TerminateSent || info.Terminate.Cause != localCatastrophic.Cause {
		t.Errorf("Query QP: Terminate %+v sent=%v, want ours (%s) sent", info.Terminate, info.TerminateSent, localCatastrophic.Cause)
	}
	tt.settle(c)
	for _, typ := range tt.eventTypes() {
		if typ == EventTerminateReceived {
			t.Errorf("events %v: the peer's Terminate, which came second, was processed", tt.eventTypes())
		}
	}
}

// messageHandler signals ch (without blocking) for each log record whose
// message is msg, and drops every record.
type messageHandler struct {
	msg string
	ch  chan struct{}
}

func (h messageHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h messageHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h messageHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h messageHandler) WithGroup(string) slog.Handler      { return h }

// TestTerminateSentWhenDestroyedAtError: a consumer that destroys the QP
// as soon as a work request fails (as the NVMe/RDMA target does with a
// queue whose host broke the protocol) still lets the Terminate go out
// (draft §6.2.3: "The RNIC MUST attempt to send the RDMAP Terminate
// Message"); the reset comes after it.
//
//   - direct: the transmitter is held until the receive CQ's direct
//     handler, which releases it and destroys the QP at once, so the reset
//     nearly always comes before the transmit goroutine could send the
//     Terminate itself (the reset waits for it: conn.awaitTerminate);
//   - polling: a goroutine polls the receive CQ and destroys the QP at the
//     first error completion. The QP must be out of RTS by then: the
//     stream fails before the error completion is pushed, or the reset
//     would find no Terminate pending.
func TestTerminateSentWhenDestroyedAtError(t *testing.T) {
	for _, polling := range []bool{false, true} {
		for i := range 10 {
			name := fmt.Sprintf("direct/%d", i)
			if polling {
				name = fmt.Sprintf("polling/%d", i)
			}
			t.Run(name, func(t *testing.T) {
				tt := newTermTarget(t, QPConfig{InboundRead: true}, 1, 64)
				p := tt.dial(t, rawpeer.Options{CRC: true})
				destroyed := make(chan error, 1)
				var seenIn QPState
				onError := func() {
					seenIn = tt.qp.State()
					destroyed <- tt.qp.Destroy()
				}
				if polling {
					stop := make(chan struct{})
					defer close(stop)
					go func() {
						var wcs [4]WC
						for {
							for _, wc := range wcs[:tt.rcq.Poll(wcs[:])] {
								if wc.Status != StatusSuccess {
									onError()
									return
								}
							}
							select {
							case <-stop:
								return
							default:
							}
						}
					}()
				} else {
					_, release := holdTransmitter(t, tt, p)
					var once sync.Once
					tt.rcq.SetDirectHandler(func() bool {
						var wcs [4]WC
						for _, wc := range wcs[:tt.rcq.Poll(wcs[:])] {
							if wc.Status != StatusSuccess {
								once.Do(func() {
									release()
									onError()
								})
							}
						}
						return true
					})
				}
				sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, make([]byte, 65)))
				tm, _, err := p.ReadTerminate(10 * time.Second)
				if err != nil {
					t.Fatalf("reading the Terminate: %v", err)
				}
				if want := ddpUntagged(term.UntaggedTooLong); tm.Cause != want {
					t.Errorf("Terminate cause %s, want %s", tm.Cause, want)
				}
				select {
				case err := <-destroyed:
					if err != nil {
						t.Errorf("Destroy QP: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the consumer never saw the receive's error completion")
				}
				if seenIn == StateRTS {
					t.Errorf("the error completion was seen with the QP still in RTS")
				}
			})
		}
	}
}
