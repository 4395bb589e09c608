package initiator

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// Slot states. The caller owns an idle slot; inflight belongs to the
// poller until it finishes the exchange; a caller whose context ended
// marks it abandoned and the poller cleans up.
const (
	slotIdle int32 = iota
	slotInflight
	slotAbandoned
	slotDone
)

// Exchange stages (what the poller waits for next).
const (
	stageResponse   = iota // a RESPONSE
	stageReadReady         // READ: READY (or an error RESPONSE)
	stageReadData          // READ: the RDMA Read's completion
	stageWriteReady        // WRITE_REQ: READY (or an error RESPONSE)
	stageReadInline        // READ with FlagInline: DATA (or an error RESPONSE)
)

// islot is one credit: one exchange at a time.
type islot struct {
	q     *iqp
	idx   int
	seq   uint16
	state atomic.Int32

	// Set by the caller before the exchange starts.
	op     blockproto.Opcode
	flags  uint16
	off    uint64
	n      uint32
	token  uint64
	bounce *bbuf

	// Poller state.
	stage int
	stag  rnic.STag // the target's buffer (READY)
	wrs   [2]rnic.SendWR
	sge   [2]rnic.SGE

	// async: the exchange was started by StartRead or StartWrite; finish
	// completes it on the spot (poller goroutine) instead of waking a
	// waiting caller.
	async bool
	areq  asyncReq

	// Result, written by the poller before done is signalled.
	status blockproto.Status
	value  uint64
	detail string
	err    error
	done   chan struct{}
}

func (sl *islot) tag() uint32 { return uint32(sl.seq)<<16 | uint32(sl.idx) }

// command encodes the slot's command into its send area and returns the
// SGE naming it.
func (sl *islot) command(op blockproto.Opcode, stag uint32) rnic.SGE {
	q := sl.q
	b, to := q.cmdBuf(sl.idx)
	f := blockproto.CommandFields{Op: op, Flags: sl.flags, Tag: sl.tag(), Offset: sl.off, Length: sl.n, STag: stag}
	if op == blockproto.OpWrite || op == blockproto.OpTrim || op == blockproto.OpWriteZeroes {
		f.Token = sl.token
	}
	if op == blockproto.OpWriteReq {
		f.Flags = 0
	}
	blockproto.Command(b).Encode(&f)
	return rnic.SGE{STag: q.txMR.STag(), TO: to, Len: blockproto.CommandLen}
}

// release posts RELEASE naming stag as a Send with Invalidate.
func (sl *islot) release(stag rnic.STag) error {
	q := sl.q
	b, to := q.relBuf(sl.idx)
	blockproto.Command(b).Encode(&blockproto.CommandFields{Op: blockproto.OpRelease, Tag: sl.tag(), STag: uint32(stag)})
	sl.sge[1] = rnic.SGE{STag: q.txMR.STag(), TO: to, Len: blockproto.CommandLen}
	_, err := q.qp.PostSend(rnic.SendWR{Op: rnic.WRSendInv, Unsignaled: true, SGL: sl.sge[1:2], InvalidateSTag: stag})
	return err
}

// run performs the exchange set up in the slot's fields and waits for its
// end; the slot is free again when it returns. keep reports whether the
// caller still owns sl.bounce: false when the caller's context ended first
// and the poller will return the buffer once the exchange is over.
func (sl *islot) run(ctx context.Context) (keep bool, res result, err error) {
	if err := sl.start(); err != nil {
		return true, res, err
	}
	select {
	case <-sl.done:
	case <-ctx.Done():
		if sl.state.CompareAndSwap(slotInflight, slotAbandoned) {
			return false, res, ctx.Err()
		}
		<-sl.done
	}
	res, err = sl.collect()
	sl.state.Store(slotIdle)
	sl.q.free <- sl.idx
	return true, res, err
}

// start sends the exchange set up in the slot's fields. It fails (and
// frees the slot) only when the QP is already dead; a failure to post
// ends the exchange through the poller instead.
func (sl *islot) start() error {
	q := sl.q
	sl.seq++
	sl.status, sl.value, sl.detail, sl.err = 0, 0, "", nil
	var n int
	switch sl.op {
	case blockproto.OpRead:
		sl.stage, sl.flags = stageReadReady, 0
		if sl.n <= q.inline {
			sl.stage, sl.flags = stageReadInline, blockproto.FlagInline
		}
		sl.sge[0] = sl.command(blockproto.OpRead, 0)
		sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
		n = 1
	case blockproto.OpWrite:
		if g, ok := q.takeGrant(); ok && sl.n <= g.Len {
			sl.stage = stageResponse
			sl.writeWRs(rnic.STag(g.STag), g.TO)
			n = 2
		} else {
			if ok {
				q.putGrant(g)
			}
			sl.stage = stageWriteReady
			sl.sge[0] = sl.command(blockproto.OpWriteReq, 0)
			sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
			n = 1
		}
	default:
		sl.stage = stageResponse
		sl.sge[0] = sl.command(sl.op, 0)
		sl.wrs[0] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: sl.sge[:1]}
		n = 1
	}
	sl.state.Store(slotInflight)
	if q.isDead() && sl.state.CompareAndSwap(slotInflight, slotIdle) {
		q.free <- sl.idx
		return errConnLost
	}
	if _, err := q.qp.PostSend(sl.wrs[:n]...); err != nil {
		// The QP is going away (or its queue overflowed, which this
		// package sizes never to happen): reset it; the poller fails
		// every exchange in flight, this one included.
		q.s.c.log.Warn("posting a command failed: resetting the QP", "err", err)
		if q.qp.State() == rnic.StateRTS {
			go q.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
		}
	}
	return nil
}

// collect returns the outcome of a finished exchange.
func (sl *islot) collect() (result, error) {
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

// writeWRs sets the RDMA Write of the data into the target buffer (stag,
// to) and the WRITE naming it as a Send with Invalidate.
func (sl *islot) writeWRs(stag rnic.STag, to uint64) {
	sl.sge[0] = sl.bounce.sge(int(sl.n))
	sl.wrs[0] = rnic.SendWR{Op: rnic.WRWrite, Unsignaled: true, SGL: sl.sge[:1], Remote: rnic.RemoteAddr{STag: stag, TO: to}}
	sl.sge[1] = sl.command(blockproto.OpWrite, uint32(stag))
	sl.wrs[1] = rnic.SendWR{Op: rnic.WRSendInv, Unsignaled: true, SGL: sl.sge[1:2], InvalidateSTag: stag}
}

// finish ends the exchange (poller goroutine): it hands the result to the
// caller, or cleans up after an abandoned one.
func (sl *islot) finish() {
	if sl.state.CompareAndSwap(slotInflight, slotDone) {
		if sl.async {
			sl.completeAsync()
			return
		}
		sl.done <- struct{}{}
		return
	}
	if sl.state.CompareAndSwap(slotAbandoned, slotIdle) {
		sl.q.s.bounce.put(sl.bounce)
		sl.bounce = nil
		sl.q.free <- sl.idx
	}
}

// fail ends an exchange in flight with errConnLost (the QP died).
func (sl *islot) fail() {
	st := sl.state.Load()
	if st != slotInflight && st != slotAbandoned {
		return
	}
	sl.err = errConnLost
	sl.finish()
}

// onResponse handles a RESPONSE to the slot's exchange.
func (sl *islot) onResponse(r blockproto.Response) error {
	if st := sl.state.Load(); st != slotInflight && st != slotAbandoned {
		return fmt.Errorf("%w: RESPONSE for idle slot %d", ErrProtocol, sl.idx)
	}
	if sl.stage == stageReadData {
		return fmt.Errorf("%w: RESPONSE during a READ's data transfer", ErrProtocol)
	}
	if (sl.stage == stageReadReady || sl.stage == stageReadInline) && r.Status() == blockproto.StatusOK {
		return fmt.Errorf("%w: RESPONSE with status OK to a READ", ErrProtocol)
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
// goes to the slot's staging buffer (a blocking caller's memory is not
// touched from the poller: the caller may have given up), or straight to
// the buffer of a StartRead, and the exchange ends.
func (sl *islot) onData(m blockproto.Data) error {
	if st := sl.state.Load(); st != slotInflight && st != slotAbandoned {
		return fmt.Errorf("%w: DATA for idle slot %d", ErrProtocol, sl.idx)
	}
	if sl.stage != stageReadInline {
		return fmt.Errorf("%w: DATA for slot %d, which did not ask for one", ErrProtocol, sl.idx)
	}
	if m.Len() != sl.n {
		return fmt.Errorf("%w: DATA of %d bytes for a %d-byte READ", ErrProtocol, m.Len(), sl.n)
	}
	if sl.async {
		copy(sl.areq.p, m.Payload()) // a StartRead's buffer is the caller's until done
	} else {
		copy(sl.bounce.b, m.Payload())
	}
	sl.q.putGrant(m.Grant().Fields())
	sl.status = blockproto.StatusOK
	sl.finish()
	return nil
}

// onReady handles a READY: start the RDMA Read of a READ, or the RDMA
// Write and WRITE of a WRITE_REQ.
func (sl *islot) onReady(r blockproto.Ready) error {
	q := sl.q
	st := sl.state.Load()
	if st != slotInflight && st != slotAbandoned {
		return fmt.Errorf("%w: READY for idle slot %d", ErrProtocol, sl.idx)
	}
	b := r.Buffer()
	if b.Len() != sl.n {
		return fmt.Errorf("%w: READY of %d bytes for a %d-byte request", ErrProtocol, b.Len(), sl.n)
	}
	q.putGrant(r.Grant().Fields())
	sl.stag = rnic.STag(b.STag())
	switch sl.stage {
	case stageReadReady:
		if st == slotAbandoned {
			err := sl.release(sl.stag)
			sl.finish()
			return err
		}
		sl.stage = stageReadData
		sl.sge[0] = sl.bounce.sge(int(sl.n))
		_, err := q.qp.PostSend(rnic.SendWR{ID: idRead | uint64(sl.idx), Op: rnic.WRRead, Local: sl.sge[0],
			Remote: rnic.RemoteAddr{STag: sl.stag, TO: b.TO()}})
		return err
	case stageWriteReady:
		if st == slotAbandoned {
			err := sl.release(sl.stag)
			sl.finish()
			return err
		}
		sl.stage = stageResponse
		sl.writeWRs(sl.stag, b.TO())
		_, err := q.qp.PostSend(sl.wrs[:2]...)
		return err
	}
	return fmt.Errorf("%w: unexpected READY on slot %d", ErrProtocol, sl.idx)
}

// onReadDone handles the completion of a READ's RDMA Read: release the
// target's buffer and finish.
func (sl *islot) onReadDone() error {
	if sl.stage != stageReadData {
		return fmt.Errorf("%w: stray RDMA Read completion on slot %d", ErrProtocol, sl.idx)
	}
	err := sl.release(sl.stag)
	sl.finish()
	return err
}
