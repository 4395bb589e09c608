package initiator

import (
	"fmt"
	"sync/atomic"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// Slot states. The caller owns an idle slot and starts an exchange on it
// (inflight); the handler finishes it (done), and the slot is idle again
// once its outcome was taken. While the caller's memory is mapped under
// the slot's STag (an RDMA Read into it or an RDMA Write from it may be
// under way) the slot is mapped: only then can the engine touch that
// memory. A waiting caller whose context ends marks an inflight (never a
// mapped) slot abandoned, and the handler cleans up after it.
const (
	slotIdle int32 = iota
	slotInflight
	slotMapped
	slotAbandoned
	slotDone
)

// Exchange stages (what the handler waits for next).
const (
	stageResponse   = iota // a RESPONSE
	stageReadReady         // READ: READY (or an error RESPONSE)
	stageReadData          // READ: the RDMA Read's completion
	stageWriteReady        // WRITE_REQ: READY (or an error RESPONSE)
	stageReadInline        // READ with FlagInline: DATA (or an error RESPONSE)
	stageExtents           // BLOCK_STATUS: EXTENTS (or an error RESPONSE)
)

// slot is one credit: one exchange at a time.
type slot struct {
	q     *conn
	idx   int
	seq   uint16
	state atomic.Int32

	// The caller's request, set before the exchange starts: p is the READ's
	// destination or the WRITE's source; the RNIC reaches it only through
	// the slot's STag, Fast-Registered over p for the data transfer and
	// invalidated after it.
	op    blockproto.Opcode
	flags uint16
	off   uint64
	n     uint32
	token uint64
	p     []byte

	mr    *rnic.MR
	stag  rnic.STag // the slot's STag as last registered
	pages [1][]byte

	// Handler state.
	stage  int
	remote rnic.STag // the target's buffer (READY, or the grant)
	fr     rnic.FastReg
	wrs    [4]rnic.SendWR
	sge    [2]rnic.SGE
	// mark names where the WRITE's Fast-Register, RDMA Write, WRITE and
	// Invalidate were queued (posted set): the RESPONSE is only believed
	// once the transmitter has gathered the WRITE, having read all of p.
	mark   rnic.SQMark
	posted bool

	// async: the exchange was started by StartRead or StartWrite; the
	// handler completes it on the spot instead of waking a waiting caller.
	async bool
	areq  asyncReq
	// starting is 1 while start runs, 2 once an async exchange finished
	// meanwhile (the QP died under it): finish then leaves the completion
	// to start, which runs it as it returns. Completing frees the slot,
	// and another request may take it at once; start still reads the
	// slot's fields, and its dead-QP clean-up must not land on that
	// request (TestStartAsyncSlotKeptWhileStarting).
	starting atomic.Int32

	// Result, written by the handler before done is signalled.
	status blockproto.Status
	value  uint64
	detail string
	err    error
	done   chan struct{}
}

func (sl *slot) tag() uint32 { return uint32(sl.seq)<<16 | uint32(sl.idx) }

// command encodes the slot's command into its send area and returns the
// SGE naming it.
func (sl *slot) command(op blockproto.Opcode, stag uint32) rnic.SGE {
	q := sl.q
	f := blockproto.CommandFields{Op: op, Flags: sl.flags, Tag: sl.tag(), Offset: sl.off, Length: sl.n, STag: stag}
	if op == blockproto.OpWrite || op == blockproto.OpTrim || op == blockproto.OpWriteZeroes {
		f.Token = sl.token
	}
	if op == blockproto.OpWriteReq {
		f.Flags = 0
	}
	blockproto.Command(q.Area(cmdArea(sl.idx))).Encode(&f)
	return q.AreaSGE(cmdArea(sl.idx), blockproto.CommandLen)
}

// release sets wrs[i] to the RELEASE naming the target's buffer, a Send
// with Invalidate of it.
func (sl *slot) release(i int) {
	q := sl.q
	blockproto.Command(q.Area(relArea(sl.idx))).Encode(&blockproto.CommandFields{Op: blockproto.OpRelease, Tag: sl.tag(),
		STag: uint32(sl.remote)})
	sl.sge[1] = q.AreaSGE(relArea(sl.idx), blockproto.CommandLen)
	sl.wrs[i] = rnic.SendWR{Op: rnic.WRSendInv, Unsignaled: true, SGL: sl.sge[1:2], InvalidateSTag: sl.remote}
}

// mapP sets wrs[i] to the Fast-Register of p[:n] under the slot's STag
// with a fresh key: acc is LocalRead for an RDMA Write's source,
// LocalWrite|RemoteWrite for an RDMA Read's sink (the verbs check Remote
// Write on the sink when the Read Response arrives, draft-hilland §7.4.2;
// the STag is never advertised, and the target is the QP's only peer).
func (sl *slot) mapP(i int, acc rnic.Access) {
	sl.stag = sl.stag.WithKey(freshKey(sl.q.s.c.dev, sl.stag))
	sl.pages[0] = sl.p[:sl.n]
	sl.fr = rnic.FastReg{STag: sl.stag, Mem: rnic.Memory{Pages: sl.pages[:], Len: uint64(sl.n)}, ZeroBased: true, Access: acc}
	sl.wrs[i] = rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &sl.fr}
}

// unmap sets wrs[i] to the Invalidate of the slot's STag: from then on
// the RNIC cannot reach p.
func (sl *slot) unmap(i int) {
	sl.wrs[i] = rnic.SendWR{Op: rnic.WRInvalidate, Unsignaled: true, InvalidateSTag: sl.stag}
}

// writeWRs sets wrs[0:4] to the write of p into the target buffer (stag,
// to): Fast-Register, RDMA Write, the WRITE naming the buffer as a Send
// with Invalidate, Invalidate of the slot's STag.
func (sl *slot) writeWRs(stag rnic.STag, to uint64) {
	sl.remote = stag
	sl.mapP(0, rnic.LocalRead)
	sl.sge[0] = rnic.SGE{STag: sl.stag, Len: sl.n}
	sl.wrs[1] = rnic.SendWR{Op: rnic.WRWrite, Unsignaled: true, SGL: sl.sge[:1], Remote: rnic.RemoteAddr{STag: stag, TO: to}}
	sl.sge[1] = sl.command(blockproto.OpWrite, uint32(stag))
	sl.wrs[2] = rnic.SendWR{Op: rnic.WRSendInv, Unsignaled: true, SGL: sl.sge[1:2], InvalidateSTag: stag}
	sl.unmap(3)
	// The slot is visible to the handler before the post records the
	// new mark: until then the mark must not name the last exchange's
	// WRs, which started long ago.
	sl.mark.Hold()
	sl.posted = true
}

// wrWriteCmd is the index in writeWRs's list of the WRITE's Send.
const wrWriteCmd = 2

// start sends the exchange set up in the slot's fields. It fails (and
// frees the slot, which the caller must then leave alone) only when the
// QP is already dead; a failure to post ends the exchange through the
// handler instead.
func (sl *slot) start() error {
	q := sl.q
	sl.seq++
	sl.status, sl.value, sl.detail, sl.err = 0, 0, "", nil
	sl.posted = false
	n, state := 1, slotInflight
	switch sl.op {
	case blockproto.OpRead:
		sl.stage, sl.flags = stageReadReady, 0
		if sl.n <= q.inline {
			sl.stage, sl.flags = stageReadInline, blockproto.FlagInline
		}
		sl.sge[0] = sl.command(blockproto.OpRead, 0)
		sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
	case blockproto.OpWrite:
		if g, ok := q.takeGrant(); ok && sl.n <= g.Len {
			sl.stage = stageResponse
			sl.writeWRs(rnic.STag(g.STag), g.TO)
			n, state = 4, slotMapped
		} else {
			if ok {
				q.putGrant(g)
			}
			sl.stage = stageWriteReady
			sl.sge[0] = sl.command(blockproto.OpWriteReq, 0)
			sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
		}
	case blockproto.OpBlockStatus:
		sl.stage = stageExtents
		sl.sge[0] = sl.command(sl.op, 0)
		sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
	default:
		sl.stage = stageResponse
		sl.sge[0] = sl.command(sl.op, 0)
		sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
	}
	sl.starting.Store(1)
	sl.state.Store(state)
	if h := q.startHook; h != nil {
		h()
	}
	if q.isDead() && sl.state.CompareAndSwap(state, slotIdle) {
		// Cleared before the slot is free: from then on another request
		// may own it, and its caller must not write it any more.
		sl.starting.Store(0)
		sl.p, sl.async, sl.areq = nil, false, asyncReq{}
		q.free <- sl.idx
		return q.cause
	}
	var err error
	if sl.posted { // a granted WRITE: its RESPONSE is checked against the mark
		_, err = q.QP.PostSendMarked(&sl.mark, sl.wrs[:n]...)
	} else {
		_, err = q.QP.PostSend(sl.wrs[:n]...)
	}
	if err != nil {
		// The QP is going away (or its queue overflowed, which this
		// package sizes never to happen): reset it; the handler fails
		// every exchange in flight, this one included. After a GOODBYE
		// that is expected (the target is closing its QPs), not a fault.
		if q.s.leaving.Load() {
			q.s.c.log.Info("posting a command on a QP the target is closing: resetting the QP", "err", err)
		} else {
			q.s.c.log.Warn("posting a command failed: resetting the QP", "err", err)
		}
		q.Reset()
	}
	if !sl.starting.CompareAndSwap(1, 0) {
		// The exchange finished while start ran: its completion is ours.
		sl.starting.Store(0)
		sl.completeAsync(false)
	}
	return nil
}

// collect returns the outcome of a finished exchange.
func (sl *slot) collect() (result, error) {
	err := sl.err
	if err == nil {
		err = statusErr(sl.op, sl.status, sl.value, sl.detail)
	}
	return result{status: sl.status, value: sl.value, detail: sl.detail}, err
}

// result is what an exchange's answer said.
type result struct {
	status blockproto.Status
	value  uint64
	detail string
}

// finish ends the exchange (handler, or stop once the QP is dead): it hands
// the outcome to the caller, or frees the slot of an abandoned one.
func (sl *slot) finish() {
	if sl.state.CompareAndSwap(slotInflight, slotDone) || sl.state.CompareAndSwap(slotMapped, slotDone) {
		if sl.async {
			if !sl.starting.CompareAndSwap(1, 2) { // else start completes it
				sl.completeAsync(true)
			}
			return
		}
		sl.done <- struct{}{}
		return
	}
	if sl.state.CompareAndSwap(slotAbandoned, slotIdle) {
		sl.p = nil
		sl.q.free <- sl.idx
	}
}

// fail ends an exchange in flight with cause, which wraps errConnLost (the
// QP died and the engine is done with it).
func (sl *slot) fail(cause error) {
	switch sl.state.Load() {
	case slotInflight, slotMapped, slotAbandoned:
		sl.err = cause
		sl.finish()
	}
}

// live reports whether the slot has an exchange the handler may advance.
func (sl *slot) live() bool {
	switch sl.state.Load() {
	case slotInflight, slotMapped, slotAbandoned:
		return true
	}
	return false
}

// onResponse handles a RESPONSE to the slot's exchange.
func (sl *slot) onResponse(r blockproto.Response) error {
	if !sl.live() {
		return fmt.Errorf("%w: RESPONSE for idle slot %d", ErrProtocol, sl.idx)
	}
	if sl.stage == stageReadData {
		return fmt.Errorf("%w: RESPONSE during a READ's data transfer", ErrProtocol)
	}
	if (sl.stage == stageReadReady || sl.stage == stageReadInline) && r.Status() == blockproto.StatusOK {
		return fmt.Errorf("%w: RESPONSE with status OK to a READ", ErrProtocol)
	}
	if sl.stage == stageExtents && r.Status() == blockproto.StatusOK {
		return fmt.Errorf("%w: RESPONSE with status OK to a BLOCK_STATUS", ErrProtocol)
	}
	if sl.stage == stageWriteReady && r.Status() == blockproto.StatusOK {
		// A WRITE_REQ's data goes only to the buffer its READY names:
		// without one the target cannot have written it.
		return fmt.Errorf("%w: RESPONSE with status OK to a WRITE_REQ", ErrProtocol)
	}
	if sl.posted && !sl.q.QP.SendGathered(&sl.mark, wrWriteCmd) {
		// The target cannot have received a WRITE our transmitter has not
		// gathered: the answer is forged, and the RDMA Write may still read
		// p. Failing the QP makes stop wait for the engine before the
		// caller gets p back.
		return fmt.Errorf("%w: RESPONSE to a WRITE on slot %d before the WRITE was sent", ErrProtocol, sl.idx)
	}
	sl.status, sl.value = r.Status(), r.Value()
	if d := r.Detail(); len(d) > 0 {
		sl.detail = string(d)
	}
	sl.q.putGrant(r.Grant().Fields())
	if sl.status == blockproto.StatusOK {
		sl.q.s.c.noteAck(sl.q.s, sl.op, sl.flags)
	}
	sl.finish()
	return nil
}

// onData handles a DATA, the answer to a READ with FlagInline: its data
// goes straight to the caller's memory (unless the caller gave up), and
// the exchange ends.
func (sl *slot) onData(m blockproto.Data) error {
	if err := sl.expect("DATA", stageReadInline); err != nil {
		return err
	}
	if m.Len() != sl.n {
		return fmt.Errorf("%w: DATA of %d bytes for a %d-byte READ", ErrProtocol, m.Len(), sl.n)
	}
	sl.deliver(m.Payload(), m.Grant().Fields(), 0)
	return nil
}

// expect checks that an answer carrying data (what) is the one the
// slot's exchange waits for.
func (sl *slot) expect(what string, stage int) error {
	st := sl.state.Load()
	if st != slotInflight && st != slotAbandoned {
		return fmt.Errorf("%w: %s for idle slot %d", ErrProtocol, what, sl.idx)
	}
	if sl.stage != stage {
		return fmt.Errorf("%w: %s for slot %d, which did not ask for one", ErrProtocol, what, sl.idx)
	}
	return nil
}

// deliver ends the exchange with its answer's payload copied to the
// caller's memory (unless the caller gave up: claiming the memory first
// keeps a waiting caller from giving up during the copy), the answer's
// grant kept and value as the result.
func (sl *slot) deliver(payload []byte, grant blockproto.GrantFields, value uint64) {
	if sl.state.CompareAndSwap(slotInflight, slotMapped) {
		copy(sl.p, payload)
	}
	sl.q.putGrant(grant)
	sl.status, sl.value = blockproto.StatusOK, value
	sl.finish()
}

// onExtents handles an EXTENTS, the answer to a BLOCK_STATUS: its
// descriptors (encoded, ExtentLen bytes each) go to the caller's buffer
// unless the caller gave up, their count to the result's value, and the
// exchange ends. They must cover at most the range asked for.
func (sl *slot) onExtents(m blockproto.Extents) error {
	if err := sl.expect("EXTENTS", stageExtents); err != nil {
		return err
	}
	var total uint64
	for i := range m.Count() {
		total += uint64(m.Extent(i).Length)
	}
	if total > uint64(sl.n) {
		return fmt.Errorf("%w: EXTENTS covering %d bytes for a %d-byte BLOCK_STATUS", ErrProtocol, total, sl.n)
	}
	sl.deliver(m[blockproto.ExtentsFixedLen:], m.Grant().Fields(), uint64(m.Count()))
	return nil
}

// onReady handles a READY: start the RDMA Read of a READ, or the RDMA
// Write and WRITE of a WRITE_REQ; for an abandoned exchange, RELEASE the
// buffer untouched.
func (sl *slot) onReady(r blockproto.Ready) error {
	q := sl.q
	if st := sl.state.Load(); st != slotInflight && st != slotAbandoned {
		return fmt.Errorf("%w: READY for idle slot %d", ErrProtocol, sl.idx)
	}
	b := r.Buffer()
	if b.Len() != sl.n {
		return fmt.Errorf("%w: READY of %d bytes for a %d-byte request", ErrProtocol, b.Len(), sl.n)
	}
	if sl.stage != stageReadReady && sl.stage != stageWriteReady {
		return fmt.Errorf("%w: unexpected READY on slot %d", ErrProtocol, sl.idx)
	}
	q.putGrant(r.Grant().Fields())
	sl.remote = rnic.STag(b.STag())
	if !sl.state.CompareAndSwap(slotInflight, slotMapped) { // abandoned
		sl.release(0)
		_, err := q.QP.PostSend(sl.wrs[0])
		sl.finish()
		return err
	}
	if sl.stage == stageReadReady {
		sl.stage = stageReadData
		sl.mapP(0, rnic.LocalWrite|rnic.RemoteWrite)
		// RDMA Read with Invalidate Local STag: the engine invalidates the
		// sink (which has Remote Write, and whose STag the Read Request
		// told the target) before it reports the Read complete, so no
		// Write of the target's, on this QP or another of the session's
		// protection domain, can reach p once the caller has it back.
		sl.wrs[1] = rnic.SendWR{ID: idRead | uint64(sl.idx), Op: rnic.WRReadInv, Local: rnic.SGE{STag: sl.stag, Len: sl.n},
			Remote: rnic.RemoteAddr{STag: sl.remote, TO: b.TO()}}
		_, err := q.QP.PostSend(sl.wrs[:2]...)
		return err
	}
	sl.stage = stageResponse
	sl.writeWRs(sl.remote, b.TO())
	_, err := q.QP.PostSendMarked(&sl.mark, sl.wrs[:4]...)
	return err
}

// onReadDone handles the completion of a READ's RDMA Read (with
// Invalidate Local STag: the caller's memory is already unmapped):
// release the target's buffer and finish.
func (sl *slot) onReadDone() error {
	if sl.stage != stageReadData || sl.state.Load() != slotMapped {
		return fmt.Errorf("%w: stray RDMA Read completion on slot %d", ErrProtocol, sl.idx)
	}
	sl.release(0)
	_, err := sl.q.QP.PostSend(sl.wrs[0])
	sl.status = blockproto.StatusOK
	sl.finish()
	return err
}

// freshKey returns a random STag key different from old's.
func freshKey(d *rnic.Device, old rnic.STag) uint8 {
	for {
		if k := d.RandomKey(); k != old.Key() {
			return k
		}
	}
}
