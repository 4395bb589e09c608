package rnic

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// The receiver: one goroutine per stream owns the socket's read side. For
// each FPDU it reads the DDP and RDMAP headers, runs the checks in the order
// of RFC 5040 §7.2 (see segment) and draft C14, and places the payload into the
// target memory: from the read buffer with the CRC computed in the same pass
// (crc32c.UpdateCopy inside mpa.Reader.ReadFull), or, for the large rest of
// a payload, by a readv straight from the socket, the CRC computed over the
// placed bytes (mpa.VecReader). Nothing is placed before
// every check of the segment passed, and a segment's effects beyond
// placement (completions, queued responses, invalidations) happen only after
// its CRC verified. A CRC failure therefore leaves at most the bytes of one
// segment in a buffer the peer was allowed to write, the operation never
// completes, and the stream is terminated (LLP/MPA/0x02).

type rxState struct {
	c  *conn
	qp *QP
	q  *ddp.RxQueues

	hdr  [ddp.UntaggedHeaderLen + rdmap.AtomicRequestLen]byte
	body [rdmap.TerminateMaxLen]byte
	hl   int // header bytes in hdr of the current segment

	// The receive WQE consumed by the Send (or Immediate Data) in progress.
	recv       recvWQE
	recvActive bool
	recvTotal  uint64
	// recvOp, recvRV and recvInv are the opcode, RDMAP version and
	// Invalidate STag field of the first segment of the message in
	// progress: every later segment must carry the same (RFC 5041 §4.3:
	// all segments of a message hold the same RsvdULP).
	recvOp  rdmap.Opcode
	recvRV  uint8
	recvInv uint32

	act      rxAction
	sawFirst bool
	// ordFinished counts the outstanding Reads and atomics finished so far (mod
	// 2^32): the MSN on QN 1 of the oldest still outstanding is ordFinished+1.
	ordFinished uint32
	// direct lists the CQs with a direct handler that this batch queued
	// completions on (see CQ.SetDirectHandler).
	direct  [2]*CQ
	ndirect int
	// respQueued: Read or Atomic Responses were queued since the last
	// batch end; they leave then, together.
	respQueued bool
	// driver is the CQ of the waiter running the loop (drive.go), with
	// its ctx; nil while the receive goroutine runs it.
	driver   *CQ
	driveCtx context.Context
}

// deferTo notes that the batch queued a completion on cq, whose direct
// handler runs at the batch's end.
func (r *rxState) deferTo(cq *CQ) {
	for i := 0; i < r.ndirect; i++ {
		if r.direct[i] == cq {
			return
		}
	}
	if r.ndirect == len(r.direct) { // cannot happen: a QP has two CQs
		cq.runDirect()
		return
	}
	r.direct[r.ndirect] = cq
	r.ndirect++
}

// batchEnd runs when the receiver is done with what it has read and is
// about to read the stream again (maybe waiting): the direct handlers of
// the CQs its completions went to take them now, and the responses it
// queued leave together, in one write if the transmitter is free.
func (r *rxState) batchEnd() {
	// A waiter that drives the receive (drive.go) when a direct handler
	// has been set leaves the handlers to the receive goroutine, to which
	// it gives the receive back at its next pause (conn.readIdle).
	if r.driver == nil || r.c.drivable() {
		for i := 0; i < r.ndirect; i++ {
			cq := r.direct[i]
			r.direct[i] = nil
			cq.runDirect()
		}
		r.ndirect = 0
	}
	if r.respQueued {
		r.respQueued = false
		r.c.push()
	}
}

// rxAction is a segment's deferred effect, applied once its CRC verified.
type rxAction struct {
	kind      actKind
	untagged  bool
	h         ddp.Untagged
	payload   int
	bytes     uint32 // receive completion length
	solicited bool
	inv       STag
	hasInv    bool
	imm       uint64
	hasImm    bool
	job       respJob
	term      rdmap.TerminateFields
	orig      uint64
}

type actKind uint8

const (
	actNone actKind = iota
	actRecvDone
	actReadData // Read Response bytes (maybe last)
	actReadLast
	actPushResp
	actAtomicResp
	actTermRecv
	actRTR
)

// protoErr is a check failure of an inbound segment.
type protoErr struct {
	f   rdmap.TerminateFields
	ev  EventType
	err error
	// wc, when set, completes the receive WQE in progress with this status
	// (a local error tied to it: no asynchronous event).
	wc Status
}

func (e *protoErr) Error() string { return e.err.Error() }

func (r *rxState) init(c *conn) {
	r.c = c
	r.qp = c.qp
	r.q = ddp.NewRxQueues(4)
	r.recv.sgl = make([]SGE, 0, max(c.qp.cfg.MaxRecvSGE, 4))
}

// perr builds a protoErr for cause, echoing the first echo bytes of hdr as
// the offending segment's headers (RFC 5040 Figure 10 decides which parts).
func (r *rxState) perr(cause term.Cause, ev EventType, echo int, ulpduLen int, format string, args ...any) *protoErr {
	var off []byte
	if echo > 0 {
		off = r.hdr[:echo]
	}
	return &protoErr{f: rdmap.TerminateFor(cause, off, ulpduLen), ev: ev,
		err: fmt.Errorf("%s: %s", cause, fmt.Sprintf(format, args...))}
}

// fromTerm converts a decoder's *term.Error.
func (r *rxState) fromTerm(te *term.Error, ev EventType, echo, ulpduLen int) *protoErr {
	p := r.perr(te.Cause, ev, echo, ulpduLen, "%s", te.Detail)
	return p
}

// midMessage reports a partly received message (an unclean close).
func (r *rxState) midMessage() bool {
	if r.recvActive {
		return true
	}
	q := r.qp.sq
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ord) > 0 && q.ord[0].got > 0
}

// flushInProgress completes the receive WQE in progress with Flushed.
func (r *rxState) flushInProgress() {
	if !r.recvActive {
		return
	}
	r.recvActive = false
	if r.qp.rq != nil {
		r.qp.rq.done()
	}
	r.pushRecv(WC{ID: r.recv.id, Op: WRRecv, Status: StatusFlushed, QPID: r.qp.id}, false)
}

// pushRecv queues the completion of the receive WQE in progress; inBatch:
// the receive loop is running (its batch's end delivers it).
func (r *rxState) pushRecv(wc WC, inBatch bool) bool {
	var held *QP
	if r.qp.cfg.SRQ != nil {
		held = r.qp
	}
	rx := r
	if !inBatch {
		rx = nil
	}
	return r.qp.cfg.RecvCQ.pushHeld(wc, held, rx)
}

// run is the receive goroutine's loop: it runs the receive, lending it to
// the waiters that drive it when they ask (drive.go), until the stream
// ends.
func (r *rxState) run() (rxEnd, error) {
	for {
		end, err, paused := r.loop()
		if !paused {
			return end, err
		}
		if end, err, ended := r.c.lend(); ended {
			return end, err
		}
	}
}

// loop receives FPDUs until the stream ends (why, and the error), or until
// it pauses at an FPDU boundary (paused; see conn.readIdle).
func (r *rxState) loop() (end rxEnd, err error, paused bool) {
	c := r.c
	rd := c.rd
	for {
		n, err := rd.Next()
		if err == mpa.ErrWouldBlock {
			return 0, nil, true
		}
		if err != nil {
			var te *term.Error
			if errors.As(err, &te) {
				c.fail(rdmap.TerminateFor(te.Cause, nil, 0), EventLLPBadFPDU, err)
				return endProtocol, err, false
			}
			return c.classifyReadErr(err, true), err, false
		}
		if end, err, stop := r.leftRTS(); stop {
			return end, err, false
		}
		r.act = rxAction{}
		perr := r.segment(n)
		if perr == errLeftRTS {
			// The QP left RTS while the segment's header was read: it
			// is a segment that arrived in Closing, not a Send without
			// a receive.
			if end, err, stop := r.leftRTS(); stop {
				return end, err, false
			}
		}
		if perr != nil {
			var pe *protoErr
			if !errors.As(perr, &pe) {
				return c.classifyReadErr(perr, false), perr, false // I/O error mid-FPDU
			}
		}
		if ferr := rd.Finish(); ferr != nil {
			var te *term.Error
			if errors.As(ferr, &te) {
				ev := EventLLPInvalidCRC
				if te.Cause.Code != term.MPACRC {
					ev = EventLLPBadFPDU
				}
				c.fail(rdmap.TerminateFor(te.Cause, nil, 0), ev, ferr)
				return endProtocol, ferr, false
			}
			return c.classifyReadErr(ferr, false), ferr, false
		}
		if perr != nil {
			pe := perr.(*protoErr)
			// The stream fails before the error completion is pushed: a
			// consumer polling on another goroutine may reset the QP as
			// soon as it sees the completion, and the reset lets the
			// Terminate out only if it is pending by then (conn.awaitTerminate).
			c.fail(pe.f, pe.ev, pe.err)
			if pe.wc != StatusSuccess && r.recvActive {
				r.completeRecv(pe.wc, 0)
			}
			return endProtocol, pe, false
		}
		if !r.sawFirst {
			r.sawFirst = true
			if !c.info.Initiator {
				c.openGate() // the Initiator opens its own gate (txMain)
			}
		}
		if end, done := r.apply(); done {
			return end, nil, false
		}
	}
}

// segment reads one FPDU's headers, checks them and places its payload.
//
// The checks follow RFC 5040 §7.2 (RFC 7306 §8.2): "1. The DDP layer MUST
// validate all DDP Segment fields. 2. The RDMA OpCode MUST be valid. 3. The
// RDMA Version MUST be valid." so a segment with several faults reports the
// first in this order: the DDP version; for untagged segments the QN, MSN
// and MO (r.q.Check, which validates the QN before indexing by it); the
// opcode, with its buffer model and queue number (rdmap.CheckCtrl: a
// mismatch is Unexpected OpCode); the RDMA version.
//
// A tagged segment's DDP fields (STag, TO) are checked after the opcode
// and version, in tagged(): what they are checked against depends on the
// opcode (an RDMA Write's STag against the registered regions and windows,
// a Read Response's against the sink of the Read it answers), so a tagged
// segment with a bad opcode or version and a bad STag reports the opcode
// or version.
func (r *rxState) segment(n int) error {
	rd := r.c.rd
	if err := rd.ReadFull(r.hdr[:ddp.TaggedHeaderLen]); err != nil {
		return err
	}
	r.hl = ddp.TaggedHeaderLen
	b0 := r.hdr[0]
	tagged := ddp.IsTagged(b0)
	if !tagged {
		r.hl = min(n, ddp.UntaggedHeaderLen)
		if err := rd.ReadFull(r.hdr[ddp.TaggedHeaderLen:r.hl]); err != nil {
			return err
		}
	}
	// 1. DDP segment fields. Every DDP error echoes the offending segment's
	// DDP header (RFC 5040 Figure 10: "DDP ... Yes"), the Invalid DDP
	// Version ones included. An untagged segment of 14..17 bytes (the MPA
	// reader refuses fewer than 14) cannot hold its header: ParseUntagged
	// reports it as DDP / Untagged Buffer / Invalid DDP Version (1/2/0x06),
	// the code for an untagged header that cannot be read as RFC 5041's
	// (DDP has no "segment too short" code; Local Catastrophic, 1/0, is for
	// local failures, which this is not), and the Terminate
	// echoes the bytes there are, zero-padded to 18.
	if tagged {
		if _, err := ddp.ParseTagged(r.hdr[:r.hl]); err != nil {
			return r.decodeErr(err, EventInvalidDDPVersion, r.hl, n)
		}
	} else if _, err := ddp.ParseUntagged(r.hdr[:r.hl]); err != nil {
		ev := EventInvalidDDPVersion
		if r.hl < ddp.UntaggedHeaderLen {
			ev = EventLLPSegmentSize
		}
		return r.decodeErr(err, ev, r.hl, n)
	}
	payload := n - r.hl
	var qn uint32
	var h ddp.Untagged
	if !tagged {
		h = ddp.Untagged(r.hdr[:r.hl])
		qn = h.QN()
		// The Terminate queue's MSN and MO are not checked: a peer's
		// Terminate is read whatever it holds, never answered.
		if qn != rdmap.QNTerminate {
			if err := r.q.Check(h, payload); err != nil {
				ev := EventRQInvalidMSN
				switch {
				case qn > 3:
					ev = EventInvalidQN
				case qn == rdmap.QNReadRequest:
					ev = EventIRRQInvalidMSN
				}
				return r.decodeErr(err, ev, r.hl, n)
			}
		}
	}
	// 2. The opcode, 3. the RDMA version.
	op, err := rdmap.CheckCtrl(r.hdr[1], tagged, qn, true)
	if err != nil {
		ev := EventUnexpectedOpcode
		var te *term.Error
		if errors.As(err, &te) {
			switch {
			case te.Cause.Layer == term.LayerDDP:
				ev = EventInvalidQN // not reached: r.q.Check saw the QN first
			case te.Cause.Code == term.OpInvalidVersion:
				ev = EventInvalidRDMAVersion
			}
		}
		return r.decodeErr(err, ev, r.hl, n)
	}
	if tagged {
		return r.tagged(op, ddp.Tagged(r.hdr[:r.hl]), payload, n)
	}
	r.act.untagged = true
	r.act.h = h
	r.act.payload = payload
	switch qn {
	case rdmap.QNSend:
		return r.send(op, h, payload, n)
	case rdmap.QNReadRequest:
		return r.request(op, h, payload, n)
	case rdmap.QNTerminate:
		return r.terminate(payload)
	default:
		return r.atomicResponse(h, payload, n)
	}
}

func (r *rxState) decodeErr(err error, ev EventType, echo, n int) error {
	var te *term.Error
	if errors.As(err, &te) {
		return r.fromTerm(te, ev, echo, n)
	}
	return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnspecified}, ev, echo, n, "%v", err)
}

// place reads n payload bytes into mp at off, its caller holding the
// region's read lock: all of them, or those the socket has now (k) and
// mpa.ErrWouldBlock. The caller then drops the lock, waits for the socket
// (conn.waitReadable), takes the lock again and checks the STag again
// before it places the rest. So a peer that stalls inside a segment never
// holds a region's lock while the receive waits for it, and an Invalidate,
// a Deallocate or a Fast-Register of the region (the consumer's, or a
// lease's expiry) does not wait for that peer; once it returns, none of
// the segment's later bytes land in the region.
func (r *rxState) place(mp *mapping, off, n uint64) (k uint64, err error) {
	rd := r.c.rd
	for k < n {
		sp := mp.span(off+k, n-k)
		m, err := rd.ReadSome(sp)
		k += uint64(m)
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// tagged handles RDMA Write and RDMA Read Response segments.
func (r *rxState) tagged(op rdmap.Opcode, h ddp.Tagged, payload, n int) error {
	qp := r.qp
	stag := STag(h.STag())
	to := h.TO()
	if op == rdmap.OpReadResponse {
		q := qp.sq
		q.mu.Lock()
		var head ordEntry
		ok := len(q.ord) > 0 && !q.ord[0].atomic
		if ok {
			head = q.ord[0]
		}
		q.mu.Unlock()
		if !ok {
			return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode},
				EventUnexpectedResponse, r.hl, n, "RDMA Read Response with no Read outstanding")
		}
		if payload > 0 {
			if stag != head.sink {
				return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidSTag},
					EventInvalidSTag, r.hl, n, "Read Response to STag %s, the Read named %s", stag, head.sink)
			}
			if to != head.sinkTO+head.got || head.got+uint64(payload) > uint64(head.size) {
				return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedBaseBounds},
					EventBaseBounds, r.hl, n, "Read Response TO 0x%x len %d outside the Read's sink", to, payload)
			}
		}
		r.act.kind = actReadData
		r.act.payload = payload
		if h.Last() {
			r.act.kind = actReadLast
		}
	}
	if payload == 0 {
		return nil // zero-length: no STag validation (RFC 5040 §5.1, §5.2)
	}
	if !qp.cfg.InboundWrite {
		return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidSTag},
			EventWriteNotEnabled, r.hl, n, "inbound RDMA Write and Read Response are not enabled on this QP")
	}
	// The payload goes in pieces when the socket does not hold all of it
	// (see place): each is checked against the STag as it is then, at its
	// own TO. A region revoked between two pieces ends the stream with
	// the Terminate a segment to the revoked STag gets.
	for done := uint64(0); ; {
		e := r.c.dev.stags.lookup(stag)
		if e == nil {
			cause, ev := faultSTag.terminate(sitePlacement)
			return r.perr(cause, ev, r.hl, n, "unknown STag %s%s", stag, placedNote(done))
		}
		e.mu.RLock()
		mp, off, f := e.remoteAccess(qp, stag, to+done, uint64(payload)-done, RemoteWrite)
		if f != faultNone {
			e.mu.RUnlock()
			cause, ev := f.terminate(sitePlacement)
			return r.perr(cause, ev, r.hl, n, "%s at STag %s TO 0x%x length %d%s", f, stag, to, payload, placedNote(done))
		}
		k, err := r.place(mp, off, uint64(payload)-done)
		e.region().notePlaced(off, k)
		e.mu.RUnlock()
		done += k
		if err != mpa.ErrWouldBlock {
			return err
		}
		if err := r.c.waitReadable(); err != nil {
			return err
		}
	}
}

// placedNote is what a placement error adds when part of the segment was
// placed before the region was found revoked.
func placedNote(done uint64) string {
	if done == 0 {
		return ""
	}
	return fmt.Sprintf(" (revoked after %d bytes of the segment were placed)", done)
}

// leftRTS reports how the receive loop ends once the QP has left RTS: a
// segment that arrives in Closing is a Bad Close (draft Figure 11, the
// stream is reset and the segment not processed).
func (r *rxState) leftRTS() (end rxEnd, err error, stop bool) {
	switch r.qp.loadState() {
	case StateTerminate:
		return endProtocol, nil, true
	case StateClosing:
		return endLost, errors.New("segment received while closing"), true
	case StateError, StateIdle:
		return endAbort, nil, true
	}
	return 0, nil, false
}

// errLeftRTS: a Send's header was read as the QP left RTS (closeGracefully
// sets the state, then flushes the RQ): the Send is a segment in Closing.
var errLeftRTS = errors.New("rnic: the QP left RTS as a Send arrived")

// send handles Send-type and Immediate Data segments (QN 0).
func (r *rxState) send(op rdmap.Opcode, h ddp.Untagged, payload, n int) error {
	if !r.sawFirst && r.c.info.RTR == RTRSend && !r.c.info.Initiator && payload == 0 && h.Last() &&
		(op == rdmap.OpSend) {
		r.act.kind = actRTR // the RFC 6581 zero-length Send RTR consumes no receive
		return nil
	}
	// A segment starts a new message when none is in progress, not when
	// its MO is 0: a message's first segments may carry no payload, and
	// the segment after them, at MO 0 again, continues it (taking a
	// receive WQE for it would lose the one the message holds).
	if r.recvActive {
		if err := r.sameMessage(op, h, n); err != nil {
			return err
		}
	} else {
		if h.MO() != 0 {
			return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedInvalidMO},
				EventRQInvalidMSN, r.hl, n, "continuation with no message in progress")
		}
		// The QP may have left RTS since the loop checked (Modify to
		// Closing while the header was read): checked before the take,
		// for an S-RQ, which Closing does not flush, and after a failed
		// one, for an RQ flushed in between.
		if r.qp.loadState() != StateRTS {
			return errLeftRTS
		}
		if !r.take() {
			if r.qp.loadState() != StateRTS {
				return errLeftRTS
			}
			return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer},
				EventRQInvalidMSN, r.hl, n, "%s with no receive posted (MSN %d)", op, h.MSN())
		}
		r.recvOp, r.recvRV, r.recvInv = op, rdmap.CtrlVersion(h.RsvdULP0()), h.RsvdULP1()
	}
	if op == rdmap.OpImmediate || op == rdmap.OpImmediateSE {
		// Immediate Data is one whole segment: it never leaves a message
		// in progress, so sameMessage refuses one that would continue one.
		if payload != rdmap.ImmediateLen || !h.Last() {
			return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnspecified},
				EventProtocolError, r.hl, n, "Immediate Data of %d bytes", payload)
		}
		b := r.body[:rdmap.ImmediateLen] // not a local array: the CRC kernels make it escape
		if err := r.c.rd.ReadFull(b); err != nil {
			return err
		}
		r.act.kind = actRecvDone
		r.act.imm, r.act.hasImm = rdmap.Immediate(b).Data(), true
		r.act.solicited = op == rdmap.OpImmediateSE
		return nil
	}
	mo := uint64(h.MO())
	if mo+uint64(payload) > r.recvTotal {
		// The receive WQE completes in error, not flushed as the WQEs
		// behind it are: the draft's §8.1.2.1 makes a receive smaller
		// than the message a completion error, and its §8.3.2 (Figure
		// 23) counts length errors as base and bounds violations. The
		// Terminate is RFC 5041's own for the case.
		p := r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedTooLong},
			EventRQMessageTooLong, r.hl, n, "%d bytes at offset %d for a %d-byte receive", payload, mo, r.recvTotal)
		p.wc = StatusBaseBounds
		return p
	}
	if err := r.scatter(mo, uint64(payload), n); err != nil {
		return err
	}
	if h.Last() {
		r.act.kind = actRecvDone
		r.act.bytes = uint32(mo + uint64(payload))
		r.act.solicited = op.Solicited()
		if op.HasInvalidate() {
			r.act.inv, r.act.hasInv = STag(h.RsvdULP1()), true
		}
	}
	return nil
}

// sameMessage checks that a segment continuing the message in progress
// carries that message's opcode, RDMAP version and, for a Send with
// Invalidate, its Invalidate STag. RFC 5041 §4.3 makes every segment of a
// message hold the same RsvdULP but gives DDP no error for a segment that
// does not: RDMAP, which reads those bytes, refuses it, in RFC 5040 §7.2's
// order. Another opcode is not a valid one for the segment (step 2):
// Remote Operation / Unexpected OpCode. Another version, though valid on
// its own (01b and 00b both are, CheckCtrl), is not the message's, so not
// a valid one (step 3): Remote Operation / Invalid RDMAP Version, as a
// first segment's bad version is. Another Invalidate STag is not the
// message's, so not a valid Invalidate STag (step 4): Remote Protection /
// Invalid STag. Each way the segment is not placed and the message never
// completes.
func (r *rxState) sameMessage(op rdmap.Opcode, h ddp.Untagged, n int) error {
	if op != r.recvOp {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode},
			EventUnexpectedOpcode, r.hl, n, "%s segment continues a %s (MSN %d)", op, r.recvOp, h.MSN())
	}
	if rv := rdmap.CtrlVersion(h.RsvdULP0()); rv != r.recvRV {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpInvalidVersion},
			EventInvalidRDMAVersion, r.hl, n, "%s segment with RDMAP version %d continues a message of version %d (MSN %d)",
			op, rv, r.recvRV, h.MSN())
	}
	if op.HasInvalidate() && h.RsvdULP1() != r.recvInv {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtInvalidSTag},
			EventInvalidSTag, r.hl, n, "%s segment names Invalidate STag %s, its message %s (MSN %d)",
			op, STag(h.RsvdULP1()), STag(r.recvInv), h.MSN())
	}
	return nil
}

// take consumes a receive WQE for a new message.
func (r *rxState) take() bool {
	qp := r.qp
	var ok bool
	if s := qp.cfg.SRQ; s != nil {
		ok = s.take(&r.recv)
		if ok {
			// QP RQ Limit (draft §6.3.8): fire once when more WQEs than the
			// limit are in progress on this QP (taken, completion not yet
			// retrieved).
			held := int(qp.srqHeld.Add(1))
			qp.mu.Lock()
			fire := qp.rqArmed && held > qp.rqLimit
			if fire {
				qp.rqArmed = false
			}
			qp.mu.Unlock()
			if fire {
				qp.dev.raise(AsyncEvent{Type: EventQPRQLimitReached, Resource: ResourceQP, QP: qp, QPID: qp.id})
			}
		}
	} else {
		ok = qp.rq.take(&r.recv)
	}
	if !ok {
		return false
	}
	r.recvActive = true
	r.recvTotal = sglLen(r.recv.sgl)
	return true
}

// scatter places n payload bytes at message offset mo into the receive
// WQE's SGL, checking each buffer (draft C14.2; an S-RQ's buffers are
// checked against the S-RQ's PD).
func (r *rxState) scatter(mo, n uint64, ulpdu int) error {
	pd := r.qp.pd
	if s := r.qp.cfg.SRQ; s != nil {
		pd = s.pd
	}
	off := mo
	for _, s := range r.recv.sgl {
		if n == 0 {
			break
		}
		l := uint64(s.Len)
		if off >= l {
			off -= l
			continue
		}
		take := min(l-off, n)
		// In pieces as in tagged: each checked against the buffer's
		// STag as it is then.
		for done := uint64(0); done < take; {
			e := r.c.dev.stags.lookup(s.STag)
			st := StatusInvalidSTag
			var k uint64
			var err error
			if e != nil {
				e.mu.RLock()
				var mp *mapping
				var moff uint64
				mp, moff, st = e.localAccess(pd, s.STag, s.TO+off+done, take-done, LocalWrite)
				if st == StatusSuccess {
					k, err = r.place(mp, moff, take-done)
				}
				e.mu.RUnlock()
			}
			if st != StatusSuccess {
				p := r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}, 0, 0, ulpdu,
					"receive buffer STag %s: %s%s", s.STag, st, placedNote(done))
				p.wc = st
				return p
			}
			done += k
			if err == mpa.ErrWouldBlock {
				err = r.c.waitReadable()
			}
			if err != nil {
				return err
			}
		}
		n -= take
		off = 0
	}
	return nil
}

// request reads a Read Request or Atomic Request (QN 1), checks what both
// share (one whole segment of the right size, a free IRD slot) and hands it
// to readRequest or atomicRequest.
func (r *rxState) request(op rdmap.Opcode, h ddp.Untagged, payload, n int) error {
	qp := r.qp
	c := r.c
	want := rdmap.ReadRequestLen
	if op == rdmap.OpAtomicRequest {
		want = rdmap.AtomicRequestLen
	}
	if !h.Last() || h.MO() != 0 {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpCatastrophicStream},
			EventNoLBit, r.hl, n, "%s split across segments", op)
	}
	if payload != want {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnspecified},
			EventInvalidReadRequest, r.hl, n, "%s of %d bytes", op, payload)
	}
	if err := c.rd.ReadFull(r.hdr[r.hl : r.hl+want]); err != nil {
		return err
	}
	full := r.hl + want
	qp.mu.Lock()
	ird := qp.ird
	qp.mu.Unlock()
	c.respMu.Lock()
	used := c.irdUsed
	c.respMu.Unlock()
	if used >= ird {
		return r.perr(term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: term.UntaggedNoBuffer},
			EventIRRQTooMany, r.hl, n, "more than IRD=%d outstanding requests", ird)
	}
	copy(r.act.job.hdr[:], r.hdr[:full])
	if op == rdmap.OpReadRequest {
		return r.readRequest(full, n)
	}
	return r.atomicRequest(full, n)
}

// readRequest checks a Read Request, whose full header bytes are in r.hdr,
// and queues its response: the source must be readable for the whole size
// now (RFC 5040 §7.2); it is checked again as each Read Response segment
// is built. A Terminate echoes the Read Request's RDMA header too.
func (r *rxState) readRequest(full, n int) error {
	qp := r.qp
	rr, err := rdmap.ParseReadRequest(r.hdr[r.hl:full])
	if err != nil {
		return r.decodeErr(err, EventInvalidReadRequest, full, n)
	}
	if !qp.cfg.InboundRead {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: term.ProtAccessRights},
			EventReadNotEnabled, full, n, "inbound RDMA Read is not enabled on this QP")
	}
	src := STag(rr.SrcSTag())
	if rr.Size() > 0 {
		f := faultSTag
		if e := r.c.dev.stags.lookup(src); e != nil {
			e.mu.RLock()
			_, _, f = e.remoteAccess(qp, src, rr.SrcTO(), uint64(rr.Size()), RemoteRead)
			e.mu.RUnlock()
		}
		if f != faultNone {
			cause, ev := f.terminate(siteRequest)
			return r.perr(cause, ev, full, n, "%s at source STag %s TO 0x%x length %d", f, src, rr.SrcTO(), rr.Size())
		}
	}
	job := &r.act.job
	job.atomic = false
	job.sinkSTag, job.sinkTO, job.size = rr.SinkSTag(), rr.SinkTO(), rr.Size()
	job.srcSTag, job.srcTO = src, rr.SrcTO()
	r.act.kind = actPushResp
	return nil
}

// atomicRequest checks an Atomic Request, whose full header bytes are in
// r.hdr, and queues it: the operation executes when its response is built.
// The target must be an 8-byte aligned word the QP may access (RFC 7306
// §8.2).
func (r *rxState) atomicRequest(full, n int) error {
	qp := r.qp
	ar, err := rdmap.ParseAtomicRequest(r.hdr[r.hl:full])
	if err != nil {
		return r.decodeErr(err, EventUnexpectedOpcode, r.hl, n)
	}
	if !qp.cfg.InboundAtomic {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode},
			EventUnexpectedOpcode, r.hl, n, "atomics are not enabled on this QP")
	}
	// The alignment that matters is the target word's address, not the
	// TO's: RFC 7306 §5.2.1, the TO "MAY start at an arbitrary offset but
	// MUST represent a ULP Buffer address that is 64-bit aligned" (a
	// zero-based region need not start on an 8-byte boundary). It is
	// checked after the STag checks it needs (§8.2: "additional
	// validation").
	stag := STag(ar.STag())
	f := faultSTag
	if e := r.c.dev.stags.lookup(stag); e != nil {
		e.mu.RLock()
		var mp *mapping
		var off uint64
		mp, off, f = e.remoteAccess(qp, stag, ar.TO(), 8, RemoteAtomic)
		if f == faultNone && mp.word(off) == nil {
			f = faultAlignment
		}
		e.mu.RUnlock()
	}
	if f != faultNone {
		cause, ev := f.terminate(siteRequest)
		return r.perr(cause, ev, r.hl, n, "%s atomic target at STag %s TO 0x%x", f, stag, ar.TO())
	}
	job := &r.act.job
	job.atomic = true
	job.req = rdmap.AtomicRequestFields{AOpcode: ar.AOpcode(), ReqID: ar.ReqID(), STag: ar.STag(), TO: ar.TO(),
		AddSwap: ar.AddSwap(), AddSwapMask: ar.AddSwapMask(), Compare: ar.Compare(), CompareMask: ar.CompareMask()}
	r.act.kind = actPushResp
	return nil
}

// terminate reads a peer's Terminate (QN 2). It is never answered with a
// Terminate, whatever it holds.
func (r *rxState) terminate(payload int) error {
	n := min(payload, len(r.body))
	if err := r.c.rd.ReadFull(r.body[:n]); err != nil {
		return err
	}
	f, err := rdmap.ParseTerminate(r.body[:n])
	if err != nil {
		r.c.log.Info("malformed Terminate received", "err", err)
		if n >= 2 {
			f = rdmap.TerminateFields{Cause: term.FromBytes(r.body[0], r.body[1])}
		}
	}
	r.act.kind = actTermRecv
	r.act.term = f
	return nil
}

// concerned returns the position in the ORD queue of the Read or Atomic
// Request whose header a received Terminate echoes, or -1. q.mu is held.
func (r *rxState) concerned(f *rdmap.TerminateFields) int {
	if !f.D || len(f.DDPHeader) < ddp.UntaggedHeaderLen || ddp.IsTagged(f.DDPHeader[0]) {
		return -1
	}
	h := ddp.Untagged(f.DDPHeader)
	if h.QN() != rdmap.QNReadRequest {
		return -1
	}
	k := h.MSN() - 1 - r.ordFinished
	if k >= uint32(len(r.qp.sq.ord)) {
		return -1
	}
	return int(k)
}

// atomicResponse handles Atomic Responses (QN 3).
func (r *rxState) atomicResponse(h ddp.Untagged, payload, n int) error {
	if payload != rdmap.AtomicResponseLen || !h.Last() || h.MO() != 0 {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnspecified},
			EventProtocolError, r.hl, n, "Atomic Response of %d bytes", payload)
	}
	b := r.body[:rdmap.AtomicResponseLen]
	if err := r.c.rd.ReadFull(b); err != nil {
		return err
	}
	resp, err := rdmap.ParseAtomicResponse(b)
	if err != nil {
		return r.decodeErr(err, EventProtocolError, r.hl, n)
	}
	q := r.qp.sq
	q.mu.Lock()
	ok := len(q.ord) > 0 && q.ord[0].atomic && q.ord[0].reqID == resp.ReqID()
	q.mu.Unlock()
	if !ok {
		return r.perr(term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpUnexpectedOpcode},
			EventUnexpectedResponse, r.hl, n, "Atomic Response %d matches no outstanding request", resp.ReqID())
	}
	r.act.kind = actAtomicResp
	r.act.orig = resp.Original()
	return nil
}

// completeRecv completes the receive WQE in progress.
func (r *rxState) completeRecv(st Status, bytes uint32) bool {
	qp := r.qp
	a := &r.act
	wc := WC{ID: r.recv.id, Op: WRRecv, Status: st, QPID: qp.id, Bytes: bytes}
	if st == StatusSuccess {
		wc.Solicited = a.solicited
		wc.Invalidated, wc.HasInvalidated = a.inv, a.hasInv
		wc.Imm, wc.HasImm = a.imm, a.hasImm
	}
	r.recvActive = false
	// Free the slot first: a consumer that polls this completion may re-post
	// at once.
	if qp.rq != nil {
		qp.rq.done()
	}
	return r.pushRecv(wc, true)
}

// apply performs a verified segment's deferred effects. It reports true when
// the receive loop must stop.
func (r *rxState) apply() (rxEnd, bool) {
	c := r.c
	qp := r.qp
	a := &r.act
	if a.untagged && a.h.QN() != rdmap.QNTerminate {
		r.q.Advance(a.h, a.payload)
	}
	switch a.kind {
	case actRecvDone:
		if a.hasInv {
			if f := c.dev.invalidate(qp, a.inv, true); f != invalidateOK {
				st := f.status
				if st != StatusInvalidSTag {
					st = StatusInvalidateFailed
				}
				r.hl = ddp.UntaggedHeaderLen
				copy(r.hdr[:], a.h)
				tf := rdmap.TerminateFor(f.cause, r.hdr[:ddp.UntaggedHeaderLen], ddp.UntaggedHeaderLen+a.payload)
				c.fail(tf, 0, fmt.Errorf("remote invalidate of %s: %s", a.inv, f.cause))
				r.completeRecv(st, 0) // after the failure, as in loop
				return endProtocol, true
			}
		}
		if !r.completeRecv(StatusSuccess, a.bytes) {
			c.tx.cqOverflow(EventCQRQError)
			return endProtocol, true
		}
	case actReadData, actReadLast:
		q := qp.sq
		q.mu.Lock()
		head := &q.ord[0]
		head.got += uint64(a.payload)
		if a.kind == actReadData {
			q.mu.Unlock()
			return 0, false
		}
		done := *head
		q.popORD()
		ok := true
		st := StatusSuccess
		if done.got != uint64(done.size) {
			q.mu.Unlock()
			c.fail(rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation,
				Code: term.OpUnspecified}}, EventProtocolError,
				fmt.Errorf("RDMA Read Response of %d bytes for a %d-byte Read", done.got, done.size))
			return endProtocol, true
		}
		if done.wqe {
			e := q.at(done.idx)
			if e.wr.Op == WRReadInv {
				if f := c.dev.invalidate(qp, e.wr.Local.STag, false); f != invalidateOK {
					st = f.status
				}
			}
			r.failBefore(st)
			ok = q.completeLocked(qp, done.idx, st, r)
		}
		return r.ordDone(st, ok)
	case actAtomicResp:
		q := qp.sq
		q.mu.Lock()
		done := q.ord[0]
		q.popORD()
		st := r.writeResult(q.at(done.idx).wr.Local, a.orig)
		r.failBefore(st)
		return r.ordDone(st, q.completeLocked(qp, done.idx, st, r))
	case actPushResp:
		c.respMu.Lock()
		c.resp = append(c.resp, a.job)
		c.irdUsed++
		c.respMu.Unlock()
		r.respQueued = true // sent at the batch's end
	case actTermRecv:
		if !r.terminateReceived(a.term) {
			return endProtocol, true // our Terminate goes out (conn.fail)
		}
		return endTermRecv, true
	}
	return 0, false
}

// failBefore fails the stream (as ordDone would) before a Read or Atomic
// WQE completes with an error st, so that the Terminate is pending when the
// consumer sees the completion (see loop). It is called with the send
// queue locked, and drops the lock meanwhile: conn.fail takes the QP's
// lock, which comes before the send queue's (QP.flush). Nothing completes
// the WQE in between: only the end of this stream flushes the send queue.
func (r *rxState) failBefore(st Status) {
	if st == StatusSuccess {
		return
	}
	q := r.qp.sq
	q.mu.Unlock()
	r.c.fail(localCatastrophic, 0, nil)
	q.mu.Lock()
}

// ordDone finishes an outstanding Read or Atomic whose WQE completed with
// st (ok: its completion fit the CQ). It is called with the send queue
// locked and unlocks it.
func (r *rxState) ordDone(st Status, ok bool) (rxEnd, bool) {
	q := r.qp.sq
	r.ordFinished++
	waiting := q.next != q.tail
	q.mu.Unlock()
	if waiting {
		r.c.kick() // an ORD slot is free for a stalled WQE
	}
	if st != StatusSuccess {
		r.c.fail(localCatastrophic, 0, nil)
		return endProtocol, true
	}
	if !ok {
		r.c.tx.cqOverflow(EventCQSQError)
		return endProtocol, true
	}
	return 0, false
}

// writeResult stores an atomic's original value (native byte order) in the
// WR's local result buffer.
func (r *rxState) writeResult(s SGE, v uint64) Status {
	e := r.c.dev.stags.lookup(s.STag)
	if e == nil {
		return StatusInvalidSTag
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	mp, off, st := e.localAccess(r.qp.pd, s.STag, s.TO, 8, LocalWrite)
	if st != StatusSuccess {
		return st
	}
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	mp.copyIn(off, b[:])
	return StatusSuccess
}

// terminateReceived moves the QP to Terminate on a peer's Terminate (draft
// T11). The WR the Terminate concerns completes with Remote Termination
// Error, the only status the draft has for it (Fig. 36): what went wrong
// (a protection error, a remote operation error, ...) is the Terminate's
// cause, which the consumer reads in the event or with Query QP. That WR is
// found by the DDP header the Terminate echoes (RFC 5040 §7.1): an RDMA Read
// or Atomic Request, named by its MSN on QN 1. A Terminate that echoes
// another message (a Write or a Send, completed when handed to TCP) or none
// (the peer's local error) concerns no outstanding WR. Every other WR is
// flushed when the stream ends.
//
// A Terminate that arrives once the stream has failed locally (conn.fail
// ran after the receive checked the QP's state at this FPDU's start) is a
// segment arriving in Terminate, which is not processed (draft Fig. 9): the
// QP keeps the Terminate it recorded, which is still sent (draft §6.2.3:
// only a Terminate state entered on a received Terminate sends none), and
// no WR completes and no event is raised for the peer's. It reports
// whether the Terminate was processed.
func (r *rxState) terminateReceived(f rdmap.TerminateFields) bool {
	qp := r.qp
	c := r.c
	qp.mu.Lock()
	if c.failed {
		qp.mu.Unlock()
		c.log.Info("Terminate received after the stream failed: not processed", "cause", f.Cause.String())
		return false
	}
	c.failed = true // a local error from now on sends no Terminate (conn.fail)
	qp.term, qp.termSent = &f, false
	if qp.state == StateRTS || qp.state == StateClosing {
		qp.setStateLocked(StateTerminate)
	}
	qp.mu.Unlock()
	q := qp.sq
	q.mu.Lock()
	if k := r.concerned(&f); k >= 0 && q.ord[k].wqe {
		// Its ORD entry stays: the stream ends now and the flush clears it.
		q.completeLocked(qp, q.ord[k].idx, StatusRemoteTermination, nil)
	}
	q.mu.Unlock()
	c.log.Info("Terminate received", "cause", f.Cause.String())
	c.dev.raise(AsyncEvent{Type: EventTerminateReceived, Resource: ResourceQP, QP: qp, QPID: qp.id, Terminate: &f,
		Err: fmt.Errorf("peer terminated the stream: %s", f.Cause)})
	return true
}
