package nvmf

import (
	"errors"

	"github.com/rnic-dev/rnic/rnic"
)

// Data movement and completions. A command's data is in the host's memory
// (keyed SGL: the controller reads it with RDMA Read or fills it with RDMA
// Write, against the host's key) or in the command capsule (in-capsule
// data of a write on an I/O queue). The controller's side of every
// transfer is the slot's data buffer, registered under the slot's STag
// just for that transfer: a Fast-Register with a fresh key before, an
// invalidation after (RDMA Read with Invalidate Local STag for reads; an
// Invalidate after the RDMA Write). So no STag of this queue is valid
// while no data moves, and the one that is names only that buffer, in the
// queue's own protection domain.
//
// The completion goes last, as a Send (or a Send with Invalidate of the
// host's key, exactly when the host asked for it: keyed SGL subtype 0xF).
// The command's receive buffer is posted again before that Send, so the
// host's next command always finds one.

// parseData checks the command's data pointer (see ParseData) into
// sl.data, with maxLen the most data the command may move. A command
// without in-capsule data gives its receive buffer back at once.
func (q *queue) parseData(sl *slot, maxLen uint32) error {
	d, err := ParseData(sl.command(), sl.inCapsule, maxLen)
	if err != nil {
		return err
	}
	sl.data = d
	sl.invalidate = d.Invalidate
	if !d.InCapsule {
		q.repost(sl)
	}
	return nil
}

// repost posts the slot's receive buffer again, if it still holds it.
func (q *queue) repost(sl *slot) {
	if sl.rx < 0 {
		return
	}
	i := sl.rx
	sl.rx = -1
	if err := q.ep.Repost(i); err != nil && !q.isDead() {
		q.log.Debug("re-posting a receive", "err", err)
	}
}

// payload is the command's data: in the capsule, or in the slot's buffer
// once fetch has read it.
func (sl *slot) payload() []byte {
	if sl.data.InCapsule {
		off := CommandLen + int(sl.data.Offset)
		return sl.q.rx(sl.rx)[off : off+int(sl.data.Len)]
	}
	return sl.buf[:sl.data.Len]
}

// fetch makes the command's data available (payload), then calls then:
// at once for in-capsule data, in the poller once the RDMA Read is done
// for keyed data. sl.buf must hold data.Len bytes for keyed data.
func (q *queue) fetch(sl *slot, then func(*slot)) {
	d := &sl.data
	if d.InCapsule || d.Len == 0 {
		then(sl)
		return
	}
	stag := q.register(sl, int(d.Len), rnic.LocalWrite|rnic.RemoteWrite)
	sl.then = then
	sl.sges[0] = rnic.SGE{STag: stag, Len: d.Len}
	sl.wrs[0] = rnic.SendWR{Op: rnic.WRFastReg, FastReg: &sl.fr, Unsignaled: true}
	sl.wrs[1] = rnic.SendWR{ID: wrRead | uint64(sl.idx), Op: rnic.WRReadInv, Local: sl.sges[0],
		Remote: rnic.RemoteAddr{STag: rnic.STag(d.Key), TO: d.Addr}}
	q.post(sl.wrs[:2])
}

// readDone continues a command whose RDMA Read completed (poller).
func (q *queue) readDone(sl *slot) {
	then := sl.then
	sl.then = nil
	if then != nil {
		then(sl)
	}
}

// register fast-registers sl.buf[:n] under the slot's STag with a new key
// (the Fast-Register WR is in sl.fr) and returns that STag.
func (q *queue) register(sl *slot, n int, access rnic.Access) rnic.STag {
	sl.stag = sl.stag.WithKey(sl.stag.Key() + 1)
	sl.pages[0] = sl.buf
	sl.fr = rnic.FastReg{STag: sl.stag, Mem: rnic.Memory{Pages: sl.pages[:], Len: uint64(n)}, ZeroBased: true, Access: access}
	return sl.stag
}

// completeData sends sl.buf[:n] to the host's keyed buffer with RDMA
// Write, then the completion (result, success).
func (q *queue) completeData(sl *slot, n int, result uint64) {
	n = min(n, int(sl.data.Len))
	if n == 0 || sl.data.InCapsule {
		q.complete(sl, result, nil)
		return
	}
	q.repost(sl)
	stag := q.register(sl, n, rnic.LocalRead)
	sl.sges[0] = rnic.SGE{STag: stag, Len: uint32(n)}
	sl.wrs[0] = rnic.SendWR{Op: rnic.WRFastReg, FastReg: &sl.fr, Unsignaled: true}
	sl.wrs[1] = rnic.SendWR{Op: rnic.WRWrite, SGL: sl.sges[0:1], Unsignaled: true,
		Remote: rnic.RemoteAddr{STag: rnic.STag(sl.data.Key), TO: sl.data.Addr}}
	sl.wrs[2] = rnic.SendWR{Op: rnic.WRInvalidate, InvalidateSTag: stag, Unsignaled: true}
	sl.wrs[3] = q.completionWR(sl, result, StatusSuccess)
	q.count(sl, StatusSuccess)
	q.post(sl.wrs[:4])
}

// complete sends the command's completion: success with result if err is
// nil, else the status err carries (a *StatusError; any other error is an
// internal error the host may retry); none for errUnanswered.
func (q *queue) complete(sl *slot, result uint64, err error) {
	if errors.Is(err, errUnanswered) {
		// The controller is ending: the slot and its buffer stay taken
		// until the queue's teardown gives them back.
		q.log.Debug("command left unanswered", "opcode", sl.command().Opcode(), "cid", sl.command().CID(), "err", err)
		return
	}
	st := StatusSuccess
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) {
			st, result = se.Status, se.Result
		} else {
			st, result = StatusInternal, 0
		}
		q.log.Debug("command failed", "opcode", sl.command().Opcode(), "cid", sl.command().CID(), "status", st, "err", err)
	}
	q.repost(sl)
	sl.wrs[0] = q.completionWR(sl, result, st)
	q.count(sl, st)
	q.post(sl.wrs[:1])
}

// completionWR encodes the slot's completion and returns its Send.
func (q *queue) completionWR(sl *slot, result uint64, st Status) rnic.SendWR {
	Completion(q.ep.Area(sl.idx)).Encode(&CompletionFields{Result: result,
		SQHead: uint16(q.sqhd.Load()), SQID: q.qid, CID: sl.command().CID(), Status: st})
	sl.sges[1] = q.ep.AreaSGE(sl.idx, CompletionLen)
	wr := rnic.SendWR{ID: wrCompletion | uint64(sl.idx), Op: rnic.WRSend, SGL: sl.sges[1:2]}
	if sl.invalidate {
		wr.Op, wr.InvalidateSTag = rnic.WRSendInv, rnic.STag(sl.data.Key)
	}
	return wr
}

// count records an I/O command's outcome in the metrics.
func (q *queue) count(sl *slot, st Status) {
	if sl.kind >= 0 {
		q.s.m.done(sl.kind, sl.began, st != StatusSuccess)
		if st.Code() == StatusReservationConf {
			q.s.m.ReservationConflicts.Add(1)
		}
	}
}

// post posts work requests; on a dead queue they are dropped (teardown
// gives every buffer back).
func (q *queue) post(wrs []rnic.SendWR) {
	if _, err := q.ep.QP.PostSend(wrs...); err != nil && !q.isDead() {
		q.log.Info("posting to the send queue failed: ending the queue", "err", err)
		go q.end("post failed")
	}
}

// withBuffer gives the slot a data buffer of n bytes and runs fn: inline
// (in the poller) when allowed and a buffer is free now, else in a
// goroutine that waits for one. The poller never waits for memory: the
// Send completions it handles are what give buffers back.
func (q *queue) withBuffer(sl *slot, n int, inline bool, fn func(*slot)) {
	if n == 0 {
		q.run(sl, inline, fn)
		return
	}
	if b := q.s.tryGetBuf(n); b != nil {
		sl.buf = b
		q.run(sl, inline, fn)
		return
	}
	q.run(sl, false, func(sl *slot) {
		b, err := q.s.getBuf(q.ctx, n)
		if err != nil {
			return // teardown
		}
		sl.buf = b
		fn(sl)
	})
}
