package rnic

import (
	"fmt"
	"math"
	"sync/atomic"
)

// PostSend queues work requests on the send queue and returns how many were
// queued: they enter in order, and the first that fails stops the list
// (draft §8.1.1). It never waits for processing. In Idle the WRs wait for
// RTS; in Closing, Terminate and Error posting fails with ErrInvalidQPState.
//
// The state check and the queuing happen under qp.mu, which every flush of
// the queues also holds (Modify ->Error, the end of a stream): a WR is
// either queued before a flush, and flushed by it, or refused.
func (qp *QP) PostSend(wrs ...SendWR) (int, error) {
	return qp.postSend(nil, wrs)
}

// SQMark records where PostSendMarked queued a list of work requests, for
// SendGathered. Its zero value marks nothing.
type SQMark struct {
	pos atomic.Uint64 // send queue position of the list's first WR, plus one; markHeld
}

// markHeld is an SQMark's value between Hold and the post.
const markHeld = math.MaxUint64

// Hold makes m await a post: SendGathered reports false until
// PostSendMarked records one. A consumer that makes an exchange visible
// (to a completion handler) before it posts the exchange's WRs holds its
// mark first, so that the handler cannot check the previous exchange's.
func (m *SQMark) Hold() { m.pos.Store(markHeld) }

// Marked reports whether m names a post, or awaits one (Hold).
func (m *SQMark) Marked() bool { return m.pos.Load() != 0 }

// PostSendMarked is PostSend that also records in m where the WRs were
// queued. m is written before the transmitter can start any of them: a
// completion handler that learns from the peer that one was received
// finds m set.
func (qp *QP) PostSendMarked(m *SQMark, wrs ...SendWR) (int, error) {
	return qp.postSend(m, wrs)
}

// SendGathered reports whether the transmitter has gathered WR i of the
// list m marks: copied all of its bytes (a Send's, an RDMA Write's) into
// the stream, or executed it. The transmitter takes WRs one at a time, in
// order, so it has gathered every WR before it too, and reads none of
// their local buffers again. It reports so before the last of the WR's
// bytes can leave. False if m marks nothing or awaits a post.
//
// A consumer uses it to check an answer against its own send queue: a
// peer cannot answer a message before all of it left, so an answer that
// comes first is forged, and the buffers it would release may still be
// read.
func (qp *QP) SendGathered(m *SQMark, i int) bool {
	v := m.pos.Load()
	if v == 0 || v == markHeld {
		return false
	}
	pos := uint32(v-1) + uint32(i)
	return int32(qp.sq.gathered.Load()-pos) > 0
}

func (qp *QP) postSend(m *SQMark, wrs []SendWR) (int, error) {
	qp.mu.Lock()
	st, destroyed, c := qp.state, qp.destroyed, qp.conn
	if destroyed {
		qp.mu.Unlock()
		return 0, fmt.Errorf("rnic: post send: %w", ErrInvalidQP)
	}
	if st != StateIdle && st != StateRTS {
		qp.mu.Unlock()
		return 0, fmt.Errorf("rnic: post send on QP %d in %s: %w", qp.id, st, ErrInvalidQPState)
	}
	// Each WR is checked before any is queued, so that the list stops at
	// the first bad one (as if checked in turn): the queue never sees it,
	// and the caller's WRs stay on its stack (no func value they pass
	// through, which would make every variadic call allocate).
	k, bad := len(wrs), error(nil)
	for i := range wrs {
		if err := qp.checkSendWR(&wrs[i]); err != nil {
			k, bad = i, err
			break
		}
	}
	n, err := qp.sq.post(wrs[:k], m)
	if err == nil {
		err = bad
	}
	qp.mu.Unlock()
	if n > 0 && c != nil && qp.plugs.Load() == 0 {
		c.pushInline()
	}
	return n, err
}

// Plug holds back the transmission of send work requests posted from now
// on until the matching Unplug, so that requests posted in a burst (say,
// one per command read from a client in one go) leave in one write to the
// socket instead of one each: the doorbell batching of hardware RNICs.
// Plugs nest. A plug only delays: the transmitter still sends what it
// finds when it runs for other reasons. The caller must Unplug before it
// waits for anything those work requests lead to.
func (qp *QP) Plug() { qp.plugs.Add(1) }

// Unplug ends a Plug; the last one starts the transmission of what was
// posted meanwhile, at once: the burst is complete, so there is nothing to
// wait for to combine with.
func (qp *QP) Unplug() {
	if qp.plugs.Add(-1) != 0 {
		return
	}
	qp.mu.Lock()
	c := qp.conn
	qp.mu.Unlock()
	if c != nil {
		c.push()
	}
}

// checkSendWR validates a WR's shape (immediate errors only; access checks
// happen when the WR is processed and fail as completions).
func (qp *QP) checkSendWR(wr *SendWR) error {
	bad := func(err error, f string, a ...any) error {
		return fmt.Errorf("rnic: post send %d (%s): %w: %s", wr.ID, wr.Op, err, fmt.Sprintf(f, a...))
	}
	switch wr.Op {
	case WRSend, WRSendSE, WRSendInv, WRSendSEInv, WRImmediate, WRImmediateSE:
		if len(wr.SGL) > qp.cfg.MaxSendSGE {
			return bad(ErrInvalidSGLLength, "%d SGEs, at most %d", len(wr.SGL), qp.cfg.MaxSendSGE)
		}
	case WRWrite, WRWriteImm:
		if len(wr.SGL) > qp.cfg.MaxWriteSGE {
			return bad(ErrInvalidSGLLength, "%d SGEs, at most %d", len(wr.SGL), qp.cfg.MaxWriteSGE)
		}
	case WRRead, WRReadInv:
		if len(wr.SGL) != 0 {
			return bad(ErrInvalidSGLFormat, "an RDMA Read names its sink in Local, not SGL")
		}
	case WRFetchAdd, WRCmpSwap:
		if wr.Local.Len != 8 {
			return bad(ErrInvalidSGLFormat, "an atomic's result buffer is 8 bytes, not %d", wr.Local.Len)
		}
	case WRBindMW:
		if wr.Bind == nil {
			return bad(ErrInvalidModifier, "missing Bind")
		}
	case WRFastReg:
		if wr.FastReg == nil {
			return bad(ErrInvalidModifier, "missing FastReg")
		}
	case WRInvalidate:
	default:
		return bad(ErrInvalidOp, "op %d", wr.Op)
	}
	if wr.Op == WRImmediate || wr.Op == WRImmediateSE {
		if len(wr.SGL) != 0 {
			return bad(ErrInvalidSGLFormat, "Immediate Data carries no SGL")
		}
	}
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Len)
	}
	if total > math.MaxUint32 {
		return bad(ErrInvalidSGLLength, "message of %d bytes", total)
	}
	return nil
}

// PostRecv queues receive work requests (QPs without an S-RQ).
func (qp *QP) PostRecv(wrs ...RecvWR) (int, error) {
	if qp.rq == nil {
		return 0, fmt.Errorf("rnic: post receive on QP %d: %w", qp.id, ErrRQHasSRQ)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock() // atomic with flushes, as in PostSend
	if qp.destroyed {
		return 0, fmt.Errorf("rnic: post receive: %w", ErrInvalidQP)
	}
	if st := qp.state; st != StateIdle && st != StateRTS {
		return 0, fmt.Errorf("rnic: post receive on QP %d in %s: %w", qp.id, st, ErrInvalidQPState)
	}
	return qp.rq.post(wrs)
}

// checkRecvSGL validates a receive WR's scatter list: its total length
// must fit a 32-bit byte count (the SGEs themselves are checked when data
// lands, draft C14.2).
func checkRecvSGL(wr *RecvWR) error {
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Len)
	}
	if total > math.MaxUint32 {
		return fmt.Errorf("rnic: post receive %d: %w: %d bytes", wr.ID, ErrInvalidSGLLength, total)
	}
	return nil
}
