package rnic

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"

	"github.com/rnic-dev/rnic/internal/sockio"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// The transmitter: one goroutine per stream owns the socket's write side.
// It takes whole messages, in order, from the responder queue (Read and
// Atomic Responses) and the send queue, alternating between the two, and
// has an mpa.Writer frame their FPDUs into one batch: header, payload copied
// from the memory region with the CRC computed in the same pass, pad and
// CRC. A batch goes to the socket in one write when it is full or when
// there is nothing more to do; WQEs whose last byte is in it complete after
// that write (RFC 5040 §5.5 rule 14).

const (
	batchFlush = 256 << 10               // write when the batch holds this much
	batchCap   = batchFlush + 2*(64<<10) // room for one more maximal FPDU
)

type txState struct {
	c       *conn
	qp      *QP
	w       *mpa.Writer // the batch
	pending []uint32    // WQEs complete once the batch is written
	msn     ddp.TxQueues
	reqID   uint32
	mulpdu  int
	hdr     [ddp.UntaggedHeaderLen + rdmap.AtomicRequestLen]byte
	scratch [rdmap.TerminateMaxLen]byte
	// preferResp alternates the two queues for fairness.
	preferResp bool
	writeErr   atomic.Pointer[error]
	off        int  // batch bytes already written (a non-blocking write stopped there)
	inline     bool // sending from pushInline: take only small messages, never block
	// writeFn writes the batch from off for c.raw.Write, made once (a
	// closure per write would allocate). While the socket is full it has
	// the poller wait (flush), or, with nowait, stops with EAGAIN in werr
	// (flushNonBlocking). Other failures end in werr too.
	writeFn func(fd uintptr) bool
	nowait  bool
	werr    error
}

func (t *txState) init(c *conn) {
	t.c = c
	t.qp = c.qp
	t.w = mpa.NewWriter(batchCap, c.info.CRC)
	t.mulpdu = c.info.MULPDU
	t.msn = ddp.TxQueues{}
	t.writeFn = func(fd uintptr) bool {
		for t.off < t.w.Len() {
			n, e := sockio.Write(fd, t.w.Bytes()[t.off:])
			switch {
			case e == 0 && n > 0:
				t.off += n
			case e == 0:
				t.werr = io.ErrShortWrite
				return true
			case e == syscall.EINTR:
			case e == syscall.EAGAIN:
				if t.nowait {
					t.werr = e
					return true
				}
				return false // wait until writable
			default:
				t.werr = os.NewSyscallError("write", e)
				return true
			}
		}
		return true
	}
}

// txMain runs the transmit side.
func (c *conn) txMain() {
	defer close(c.txDone)
	t := &c.tx
	if !c.info.Initiator {
		// A Responder sends nothing before the Initiator's first FPDU.
	wait:
		for {
			select {
			case <-c.gate:
				break wait
			case <-c.doorbell:
				if txMode(c.mode.Load()) != txRun {
					break wait
				}
			case <-c.stop:
				return
			}
		}
	} else if c.info.RTR != RTRNone {
		// The RTR is the Initiator's first FPDU: nothing is sent inline
		// before it (the gate is still closed).
		c.txMu.Lock()
		if txMode(c.mode.Load()) == txRun {
			t.sendRTR()
		}
		c.openGate()
		c.txMu.Unlock()
	}
	for {
		c.txMu.Lock()
		exit := t.run()
		c.txMu.Unlock()
		if exit {
			return
		}
		select {
		case <-c.doorbell:
		case <-c.stop:
			return
		}
	}
}

// run sends everything there is to send (c.txMu held). It reports true when
// the transmitter must stop.
func (t *txState) run() bool {
	c := t.c
	for {
		switch txMode(c.mode.Load()) {
		case txAbort:
			return true
		case txTerminate:
			t.flush()
			t.sendTerminate()
			t.flush()
			closeWrite(c.nc)
			return true
		case txSilent:
			t.w.Reset()
			t.off = 0
			closeWrite(c.nc)
			return true
		case txGraceful:
			t.flush()
			closeWrite(c.nc)
			return true
		}
		if t.step() {
			if t.w.Len() >= batchFlush {
				t.flush()
			}
			continue
		}
		if t.flush() {
			continue // completions may have released a fence
		}
		return false
	}
}

// Inline transmission: a goroutine that has just queued work (PostSend, or
// the receiver queuing a Read or Atomic Response) sends it itself when the
// transmitter is idle, saving two goroutine hand-offs per message. It takes
// only small messages and writes without blocking; whatever it cannot
// finish, the transmit goroutine does.
const (
	inlineMsg   = 64 << 10  // largest message sent inline
	inlineBatch = 128 << 10 // stop taking messages past this
)

// pushInline sends what is queued if the transmitter is free, else wakes it.
//
// Combining: posters that arrive while one of them is yielding leave their
// work queued for it. The first yields once (runtime.Gosched) before it
// takes the transmitter, so goroutines made runnable together (workers
// woken by one batch of completions, requests read in one burst) add their
// messages first and all go out in one write. Alone, the yield costs well
// under a microsecond; a loopback write saved costs several. Not while a
// waiter drives the stream's receive (drive.go): its consumer posts alone,
// and the yield, which always wakes an idle P, woke another thread per
// post (BenchmarkRead4K).
func (c *conn) pushInline() {
	if c.combining.Swap(true) {
		return // the goroutine yielding in pushInline sends ours too
	}
	if c.drive.baton.Load() != batonLent {
		runtime.Gosched()
	}
	// Clear before draining: work queued after this store finds the flag
	// clear and pushes (or kicks) itself.
	c.combining.Store(false)
	c.push()
}

// push sends what is queued, inline if the transmitter is free, else wakes
// it.
func (c *conn) push() {
	if txMode(c.mode.Load()) != txRun || c.raw == nil || !c.gateOpen() || !c.txMu.TryLock() {
		c.kick()
		return
	}
	t := &c.tx
	done := false
	if t.off == 0 && t.w.Len() == 0 {
		t.inline = true
		for t.w.Len() < inlineBatch && txMode(c.mode.Load()) == txRun && t.step() {
		}
		t.inline = false
		done = t.flushNonBlocking()
	}
	more := !done || t.hasWork()
	c.txMu.Unlock()
	if more {
		c.kick()
	}
}

func (c *conn) gateOpen() bool {
	select {
	case <-c.gate:
		return true
	default:
		return false
	}
}

// hasWork reports queued WQEs or responses (a hint: the transmit goroutine
// rechecks under its lock).
func (t *txState) hasWork() bool {
	q := t.qp.sq
	q.mu.Lock()
	w := q.next != q.tail
	q.mu.Unlock()
	if w {
		return true
	}
	return t.c.respPending()
}

func closeWrite(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// step sends one message; it reports false when nothing could be sent.
func (t *txState) step() bool {
	t.preferResp = !t.preferResp
	if t.preferResp {
		return t.sendResponse() || t.sendWQE()
	}
	return t.sendWQE() || t.sendResponse()
}

// writeFailed ends the stream after a failed write.
func (t *txState) writeFailed(err error) {
	c := t.c
	t.writeErr.Store(&err)
	c.log.Debug("write failed", "err", err)
	t.w.Reset()
	t.off = 0
	t.pending = t.pending[:0]
	c.setMode(txAbort)
	reset(c.nc) // the receive loop sees the failure and ends the stream
}

// flush writes the batch (blocking) and completes the WQEs it finished. It
// reports whether any WQE completed.
func (t *txState) flush() bool {
	if t.off < t.w.Len() {
		var err error
		if t.c.raw != nil {
			err = t.writeRaw(false)
		} else {
			_, err = t.c.nc.Write(t.w.Bytes()[t.off:])
		}
		if err != nil {
			t.writeFailed(err)
			return false
		}
	}
	t.w.Reset()
	t.off = 0
	return t.completePending()
}

// flushNonBlocking writes what the socket takes now. It reports whether the
// whole batch went out (and completes its WQEs if so).
func (t *txState) flushNonBlocking() bool {
	if t.off < t.w.Len() {
		err := t.writeRaw(true)
		if errors.Is(err, syscall.EAGAIN) {
			return false
		}
		if err != nil {
			t.writeFailed(err)
			return false
		}
	}
	t.w.Reset()
	t.off = 0
	t.completePending()
	return true
}

// writeRaw writes the rest of the batch through c.raw (writeFn); with
// nowait it stops with EAGAIN when the socket is full.
func (t *txState) writeRaw(nowait bool) error {
	t.werr, t.nowait = nil, nowait
	if err := t.c.raw.Write(t.writeFn); err != nil {
		return err
	}
	return t.werr
}

func (t *txState) completePending() bool {
	if len(t.pending) == 0 {
		return false
	}
	q := t.qp.sq
	ok := true
	q.mu.Lock()
	for _, idx := range t.pending {
		if !q.completeLocked(t.qp, idx, StatusSuccess, nil) {
			ok = false
		}
	}
	q.mu.Unlock()
	t.pending = t.pending[:0]
	if !ok {
		t.cqOverflow(EventCQSQError)
	}
	return true
}

func (t *txState) cqOverflow(ev EventType) {
	t.c.fail(rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation,
		Code: term.OpCatastrophicStream}}, ev, nil)
}

// beginFPDU starts an FPDU whose ULPDU is hdr followed by n payload bytes.
// When the batch has no room for it, the transmit goroutine writes the
// batch first; an inline sender, which must not block, lets it grow.
func (t *txState) beginFPDU(hdr []byte, n int) {
	if !t.inline && !t.w.Fits(len(hdr)+n) {
		t.flush()
	}
	t.w.Begin(hdr, n)
}

func (t *txState) untagged(op rdmap.Opcode, last bool, inv uint32, qn, msn, mo uint32) []byte {
	h := ddp.Untagged(t.hdr[:ddp.UntaggedHeaderLen])
	h.Encode(&ddp.UntaggedFields{Last: last, RsvdULP0: rdmap.Ctrl(op), RsvdULP1: inv, QN: qn, MSN: msn, MO: mo})
	return t.hdr[:ddp.UntaggedHeaderLen]
}

func (t *txState) tagged(op rdmap.Opcode, last bool, stag uint32, to uint64) []byte {
	h := ddp.Tagged(t.hdr[:ddp.TaggedHeaderLen])
	h.Encode(&ddp.TaggedFields{Last: last, RsvdULP: rdmap.Ctrl(op), STag: stag, TO: to})
	return t.hdr[:ddp.TaggedHeaderLen]
}

// running reports whether the stream may still send messages.
func (t *txState) running() bool { return txMode(t.c.mode.Load()) == txRun }

// sendRTR sends the RFC 6581 ready-to-receive message as the first FPDU.
func (t *txState) sendRTR() {
	switch t.c.info.RTR {
	case RTRWrite:
		t.beginFPDU(t.tagged(rdmap.OpWrite, true, 0, 0), 0)
		t.w.End()
	case RTRRead:
		q := t.qp.sq
		q.mu.Lock()
		q.ord = append(q.ord, ordEntry{wqe: false})
		q.mu.Unlock()
		h := t.untagged(rdmap.OpReadRequest, true, 0, rdmap.QNReadRequest, t.msn.Next(rdmap.QNReadRequest), 0)
		rr := rdmap.ReadRequest(t.hdr[ddp.UntaggedHeaderLen : ddp.UntaggedHeaderLen+rdmap.ReadRequestLen])
		rr.Encode(&rdmap.ReadRequestFields{})
		t.beginFPDU(t.hdr[:len(h)+rdmap.ReadRequestLen], 0)
		t.w.End()
	case RTRSend:
		t.beginFPDU(t.untagged(rdmap.OpSend, true, 0, rdmap.QNSend, t.msn.Next(rdmap.QNSend), 0), 0)
		t.w.End()
	}
	t.flush()
}

// sendTerminate appends the pending Terminate (QN 2).
func (t *txState) sendTerminate() {
	f := t.c.termOut
	if f == nil {
		return
	}
	body := rdmap.AppendTerminate(t.scratch[:0], f)
	h := t.untagged(rdmap.OpTerminate, true, 0, rdmap.QNTerminate, t.msn.Next(rdmap.QNTerminate), 0)
	t.beginFPDU(h, len(body))
	t.w.Payload(body)
	t.w.End()
}

// localError completes WQE idx with st and terminates the stream with an
// RDMAP Local Catastrophic Error (draft Fig. 23: 0x0000). The completion
// reports it, so no asynchronous event is raised.
func (t *txState) localError(idx uint32, st Status) {
	// The stream fails first: a consumer that resets the QP on seeing the
	// completion then finds the Terminate pending (rxState.loop).
	t.c.fail(localCatastrophic, 0, nil)
	q := t.qp.sq
	q.mu.Lock()
	q.completeLocked(t.qp, idx, st, nil)
	q.mu.Unlock()
}

// sendWQE starts the next send queue WQE, if its fences and ORD allow.
func (t *txState) sendWQE() bool {
	qp := t.qp
	q := qp.sq
	q.mu.Lock()
	if q.next == q.tail {
		q.mu.Unlock()
		return false
	}
	idx := q.next
	e := q.at(idx)
	wr := &e.wr
	if wr.ReadFence && len(q.ord) > 0 {
		q.mu.Unlock()
		return false
	}
	if wr.LocalFence && (q.head != idx || len(t.pending) > 0) {
		q.mu.Unlock()
		return false
	}
	if wr.Op.isReadLike() {
		ord := qp.currentORD()
		if ord == 0 {
			e.state = sqStarted
			q.next++
			q.mu.Unlock()
			t.localError(idx, StatusZeroORD)
			q.gatheredTo(idx)
			return true
		}
		if len(q.ord) >= ord {
			q.mu.Unlock()
			return false // stall until a response frees a slot
		}
	}
	if t.inline && (wr.Op == WRSend || wr.Op == WRSendSE || wr.Op == WRSendInv || wr.Op == WRSendSEInv ||
		wr.Op == WRWrite || wr.Op == WRWriteImm) && sglLen(wr.SGL) > inlineMsg {
		q.mu.Unlock()
		return false // big: leave it to the transmit goroutine
	}
	e.state = sqStarted
	q.next++
	q.mu.Unlock()
	// The slot stays ours until its completion is emitted: head <= idx.
	switch wr.Op {
	case WRSend, WRSendSE, WRSendInv, WRSendSEInv:
		t.sendSend(idx, wr)
	case WRWrite, WRWriteImm:
		t.sendWrite(idx, wr)
	case WRImmediate, WRImmediateSE:
		t.sendImmediate(idx, wr.Op == WRImmediateSE, wr.Imm)
		t.pending = append(t.pending, idx)
	case WRRead, WRReadInv:
		t.sendRead(idx, wr)
	case WRFetchAdd, WRCmpSwap:
		t.sendAtomic(idx, wr)
	case WRBindMW:
		t.localOp(idx, t.c.dev.bindMW(qp, wr.Bind))
	case WRFastReg:
		t.localOp(idx, t.c.dev.fastRegister(qp, wr.FastReg))
	case WRInvalidate:
		t.localOp(idx, t.c.dev.invalidate(qp, wr.InvalidateSTag, false).status)
	default:
		t.localError(idx, StatusInvalidWQE)
	}
	// Whatever became of it (sent, failed, a local operation), the WQE is
	// gathered now; a Send or an RDMA Write said so earlier, before its
	// last bytes could leave.
	q.gatheredTo(idx)
	return true
}

// localOp completes a memory operation WQE (no wire traffic).
func (t *txState) localOp(idx uint32, st Status) {
	if st != StatusSuccess {
		t.localError(idx, st)
		return
	}
	q := t.qp.sq
	q.mu.Lock()
	ok := q.completeLocked(t.qp, idx, StatusSuccess, nil)
	q.mu.Unlock()
	if !ok {
		t.cqOverflow(EventCQSQError)
	}
}

func sglLen(sgl []SGE) uint64 {
	var n uint64
	for _, s := range sgl {
		n += uint64(s.Len)
	}
	return n
}

// gather appends n bytes of the SGL starting at message offset off to the
// FPDU being built, checking each local buffer (draft C14.2) under its
// entry's read lock.
func (t *txState) gather(sgl []SGE, off, n uint64) Status {
	dev := t.c.dev
	for _, s := range sgl {
		if n == 0 {
			break
		}
		l := uint64(s.Len)
		if off >= l {
			off -= l
			continue
		}
		take := min(l-off, n)
		e := dev.stags.lookup(s.STag)
		if e == nil {
			return StatusInvalidSTag
		}
		e.mu.RLock()
		mp, moff, st := e.localAccess(t.qp.pd, s.STag, s.TO+off, take, LocalRead)
		if st != StatusSuccess {
			e.mu.RUnlock()
			return st
		}
		for rem := take; rem > 0; {
			sp := mp.span(moff, rem)
			t.w.Payload(sp)
			moff += uint64(len(sp))
			rem -= uint64(len(sp))
		}
		e.mu.RUnlock()
		n -= take
		off = 0
	}
	return StatusSuccess
}

func (t *txState) sendSend(idx uint32, wr *SendWR) {
	var op rdmap.Opcode
	var inv uint32
	switch wr.Op {
	case WRSend:
		op = rdmap.OpSend
	case WRSendSE:
		op = rdmap.OpSendSE
	case WRSendInv:
		op, inv = rdmap.OpSendInv, uint32(wr.InvalidateSTag)
	case WRSendSEInv:
		op, inv = rdmap.OpSendSEInv, uint32(wr.InvalidateSTag)
	}
	total := sglLen(wr.SGL)
	msn := t.msn.Next(rdmap.QNSend)
	for off, n := range ddp.Segments(int(total), t.mulpdu-ddp.UntaggedHeaderLen) {
		if !t.running() {
			return
		}
		last := uint64(off+n) == total
		t.beginFPDU(t.untagged(op, last, inv, rdmap.QNSend, msn, uint32(off)), n)
		if st := t.gather(wr.SGL, uint64(off), uint64(n)); st != StatusSuccess {
			t.w.Abandon()
			t.localError(idx, st)
			return
		}
		t.w.End()
		if last {
			t.qp.sq.gatheredTo(idx) // before the flush that may send it
		}
		if t.w.Len() >= batchFlush && !t.inline {
			t.flush()
		}
	}
	t.pending = append(t.pending, idx)
}

func (t *txState) sendWrite(idx uint32, wr *SendWR) {
	total := sglLen(wr.SGL)
	for off, n := range ddp.Segments(int(total), t.mulpdu-ddp.TaggedHeaderLen) {
		if !t.running() {
			return
		}
		last := uint64(off+n) == total
		t.beginFPDU(t.tagged(rdmap.OpWrite, last, uint32(wr.Remote.STag), wr.Remote.TO+uint64(off)), n)
		if st := t.gather(wr.SGL, uint64(off), uint64(n)); st != StatusSuccess {
			t.w.Abandon()
			t.localError(idx, st)
			return
		}
		t.w.End()
		if last {
			t.qp.sq.gatheredTo(idx) // before the flush that may send it
		}
		if t.w.Len() >= batchFlush && !t.inline {
			t.flush()
		}
	}
	if wr.Op == WRWriteImm {
		t.sendImmediate(idx, false, wr.Imm)
	}
	t.pending = append(t.pending, idx)
}

func (t *txState) sendImmediate(idx uint32, se bool, imm uint64) {
	op := rdmap.OpImmediate
	if se {
		op = rdmap.OpImmediateSE
	}
	h := t.untagged(op, true, 0, rdmap.QNSend, t.msn.Next(rdmap.QNSend), 0)
	b := t.scratch[:rdmap.ImmediateLen] // not a local array: the CRC kernels make it escape
	rdmap.Immediate(b).SetData(imm)
	t.beginFPDU(h, len(b))
	t.w.Payload(b)
	t.w.End()
}

func (t *txState) sendRead(idx uint32, wr *SendWR) {
	q := t.qp.sq
	q.mu.Lock()
	q.ord = append(q.ord, ordEntry{idx: idx, wqe: true, sink: wr.Local.STag, sinkTO: wr.Local.TO, size: wr.Local.Len})
	q.mu.Unlock()
	h := t.untagged(rdmap.OpReadRequest, true, 0, rdmap.QNReadRequest, t.msn.Next(rdmap.QNReadRequest), 0)
	rr := rdmap.ReadRequest(t.hdr[len(h) : len(h)+rdmap.ReadRequestLen])
	rr.Encode(&rdmap.ReadRequestFields{SinkSTag: uint32(wr.Local.STag), SinkTO: wr.Local.TO, Size: wr.Local.Len,
		SrcSTag: uint32(wr.Remote.STag), SrcTO: wr.Remote.TO})
	t.beginFPDU(t.hdr[:len(h)+rdmap.ReadRequestLen], 0)
	t.w.End()
}

func (t *txState) sendAtomic(idx uint32, wr *SendWR) {
	t.reqID++
	q := t.qp.sq
	q.mu.Lock()
	q.ord = append(q.ord, ordEntry{idx: idx, wqe: true, atomic: true, reqID: t.reqID})
	q.mu.Unlock()
	h := t.untagged(rdmap.OpAtomicRequest, true, 0, rdmap.QNReadRequest, t.msn.Next(rdmap.QNReadRequest), 0)
	f := rdmap.AtomicRequestFields{ReqID: t.reqID, STag: uint32(wr.Remote.STag), TO: wr.Remote.TO,
		AddSwap: wr.AddSwap, AddSwapMask: wr.AddSwapMask}
	if wr.Op == WRFetchAdd {
		f.AOpcode = rdmap.AtomicFetchAdd
		f.CompareMask = ^uint64(0) // RFC 7306: all ones on transmit for FetchAdd
	} else {
		f.AOpcode = rdmap.AtomicCmpSwap
		f.Compare, f.CompareMask = wr.Compare, wr.CompareMask
	}
	ar := rdmap.AtomicRequest(t.hdr[len(h) : len(h)+rdmap.AtomicRequestLen])
	ar.Encode(&f)
	t.beginFPDU(t.hdr[:len(h)+rdmap.AtomicRequestLen], 0)
	t.w.End()
}

// respJob is a queued inbound Read Request or Atomic Request.
type respJob struct {
	atomic bool
	// The request's DDP and RDMAP headers, echoed if it fails later.
	hdr [ddp.UntaggedHeaderLen + rdmap.AtomicRequestLen]byte
	// Read Request
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	srcSTag  STag
	srcTO    uint64
	// Atomic Request
	req rdmap.AtomicRequestFields
	// released: the transmitter freed the request's IRD place (releaseIRD).
	released bool
}

// sendResponse sends the oldest queued response.
func (t *txState) sendResponse() bool {
	c := t.c
	c.respMu.Lock()
	if len(c.resp) == 0 {
		c.respMu.Unlock()
		return false
	}
	job := c.resp[0]
	c.respMu.Unlock()
	if t.inline && !job.atomic && job.size > inlineMsg {
		return false
	}
	if job.atomic {
		t.sendAtomicResponse(&job)
	} else {
		t.sendReadResponse(&job)
	}
	c.respMu.Lock()
	copy(c.resp, c.resp[1:])
	c.resp = c.resp[:len(c.resp)-1]
	if !job.released {
		c.irdUsed--
	}
	c.respMu.Unlock()
	return true
}

// releaseIRD frees the response's place in the IRD before its last FPDU
// can leave (a full batch is written before the response returns): once
// the peer has that FPDU it may send its next request, which must find the
// place free. The response stays queued until it is sent.
func (t *txState) releaseIRD(job *respJob) {
	c := t.c
	c.respMu.Lock()
	c.irdUsed--
	c.respMu.Unlock()
	job.released = true
}

func (t *txState) sendReadResponse(job *respJob) {
	if job.size == 0 {
		t.releaseIRD(job)
		t.beginFPDU(t.tagged(rdmap.OpReadResponse, true, job.sinkSTag, job.sinkTO), 0)
		t.w.End()
		return
	}
	dev := t.c.dev
	for off, n := range ddp.Segments(int(job.size), t.mulpdu-ddp.TaggedHeaderLen) {
		if !t.running() {
			return
		}
		f := faultSTag
		e := dev.stags.lookup(job.srcSTag)
		if e != nil {
			e.mu.RLock()
			var mp *mapping
			var moff uint64
			mp, moff, f = e.remoteAccess(t.qp, job.srcSTag, job.srcTO+uint64(off), uint64(n), RemoteRead)
			if f == faultNone {
				last := off+n == int(job.size)
				if last {
					t.releaseIRD(job)
				}
				t.beginFPDU(t.tagged(rdmap.OpReadResponse, last, job.sinkSTag, job.sinkTO+uint64(off)), n)
				for rem := uint64(n); rem > 0; {
					sp := mp.span(moff, rem)
					t.w.Payload(sp)
					moff += uint64(len(sp))
					rem -= uint64(len(sp))
				}
				t.w.End()
			}
			e.mu.RUnlock()
		}
		if f != faultNone {
			// The source went away mid-transfer: echo the request updated by
			// what was already sent (RFC 5040 §4.8).
			rr := rdmap.ReadRequest(job.hdr[ddp.UntaggedHeaderLen : ddp.UntaggedHeaderLen+rdmap.ReadRequestLen])
			rr.SetSinkTO(job.sinkTO + uint64(off))
			rr.SetSize(job.size - uint32(off))
			rr.SetSrcTO(job.srcTO + uint64(off))
			cause, ev := f.terminate(siteRequest)
			tf := rdmap.TerminateFor(cause, job.hdr[:ddp.UntaggedHeaderLen+rdmap.ReadRequestLen], ddp.UntaggedHeaderLen+rdmap.ReadRequestLen)
			t.c.fail(tf, ev, nil)
			return
		}
		if t.w.Len() >= batchFlush && !t.inline {
			t.flush()
		}
	}
}

func (t *txState) sendAtomicResponse(job *respJob) {
	dev := t.c.dev
	r := &job.req
	stag := STag(r.STag)
	f := faultSTag
	var orig uint64
	if e := dev.stags.lookup(stag); e != nil {
		e.mu.RLock()
		var mp *mapping
		var off uint64
		mp, off, f = e.remoteAccess(t.qp, stag, r.TO, 8, RemoteAtomic)
		if f == faultNone {
			if w := mp.word(off); w == nil {
				f = faultAlignment
			} else {
				orig = doAtomic(w, r)
			}
		}
		e.mu.RUnlock()
	}
	if f != faultNone {
		cause, ev := f.terminate(siteRequest)
		tf := rdmap.TerminateFor(cause, job.hdr[:ddp.UntaggedHeaderLen+rdmap.AtomicRequestLen], ddp.UntaggedHeaderLen+rdmap.AtomicRequestLen)
		t.c.fail(tf, ev, nil)
		return
	}
	t.releaseIRD(job)
	h := t.untagged(rdmap.OpAtomicResponse, true, 0, rdmap.QNAtomicResponse, t.msn.Next(rdmap.QNAtomicResponse), 0)
	b := t.scratch[:rdmap.AtomicResponseLen]
	rdmap.AtomicResponse(b).Encode(&rdmap.AtomicResponseFields{ReqID: r.ReqID, Original: orig})
	t.beginFPDU(h, len(b))
	t.w.Payload(b)
	t.w.End()
}
