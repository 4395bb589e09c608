package initiator

import (
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// handle advances the exchanges and atomics with a batch of completions
// (the endpoint's loop): it reposts receives, and once the batch is
// handled flushes the completions it delivered. False: the QP died and
// the loop must stop.
func (q *conn) handle(wcs []rnic.WC) bool {
	q.handling = true
	ok := q.dispatch(wcs)
	q.handling = false
	q.flush()
	return ok
}

func (q *conn) dispatch(wcs []rnic.WC) bool {
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != rnic.StatusSuccess {
			if wc.Status != rnic.StatusFlushed { // the engine flushes after it stopped
				q.s.c.log.Warn("work request failed: dropping the session", "qp", q.QP.ID(), "err", wc.Err())
			}
			q.die(fmt.Errorf("%w: QP %d: %w", errConnLost, q.QP.ID(), wc.Err()))
			return false
		}
		var err error
		switch {
		case wc.Op == rnic.WRRecv:
			err = q.onRecv(wc)
		case wc.ID&idRead != 0:
			if k := int(wc.ID & idMask); k < len(q.slots) {
				err = q.slots[k].onReadDone()
			}
		case wc.ID&idAtom != 0:
			if k := int(wc.ID & idMask); k < numAtoms {
				q.atoms[k].done <- wc.Status
			}
		}
		if err != nil {
			if errors.Is(err, rnic.ErrInvalidQPState) && q.QP.State() != rnic.StateRTS {
				// A repost after the stream ended under the handler (a
				// reset or a Terminate from the target): the engine's
				// events and the flushed completions report the loss.
				q.s.c.log.Info("stream ended: dropping the session", "qp", q.QP.ID(), "err", err)
			} else {
				q.s.c.log.Warn("dropping the session", "qp", q.QP.ID(), "err", err)
			}
			q.die(fmt.Errorf("%w: %w", errConnLost, err))
			return false
		}
	}
	return true
}

// onRecv handles one message from the target.
func (q *conn) onRecv(wc *rnic.WC) error {
	i := int(wc.ID)
	msg := q.Received(wc)
	if wc.HasInvalidated {
		return fmt.Errorf("%w: the target sent a Send with Invalidate", ErrProtocol)
	}
	h, err := blockproto.ParseHeader(msg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	switch h.Opcode() {
	case blockproto.OpResponse:
		r, err := blockproto.ParseResponse(msg)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		sl, err := q.slotOf(r.Tag())
		if err != nil {
			return err
		}
		// onResponse copies what it keeps out of msg. After an error the QP is
		// dropped: no repost, whose failure would hide the cause.
		if err := sl.onResponse(r); err != nil {
			return err
		}
		return q.Repost(i)
	case blockproto.OpReady:
		r, err := blockproto.ParseReady(msg)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		var rb [blockproto.ReadyLen]byte
		copy(rb[:], r)
		if err := q.Repost(i); err != nil {
			return err
		}
		sl, err := q.slotOf(r.Tag())
		if err != nil {
			return err
		}
		return sl.onReady(rb[:])
	case blockproto.OpData:
		m, err := blockproto.ParseData(msg)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		sl, err := q.slotOf(m.Tag())
		if err != nil {
			return err
		}
		// onData copies the data out of msg. After an error the QP is
		// dropped: no repost, whose failure would hide the cause.
		if err := sl.onData(m); err != nil {
			return err
		}
		return q.Repost(i)
	case blockproto.OpExtents:
		m, err := blockproto.ParseExtents(msg, minIO)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		sl, err := q.slotOf(m.Tag())
		if err != nil {
			return err
		}
		// onExtents copies the descriptors out of msg. After an error the QP is
		// dropped: no repost, whose failure would hide the cause.
		if err := sl.onExtents(m); err != nil {
			return err
		}
		return q.Repost(i)
	case blockproto.OpGoodbye:
		r, err := blockproto.ParseResponse(msg)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		synced := r.Value() == blockproto.GoodbyeSynced
		q.s.c.log.Info("target says goodbye", "qp", q.QP.ID(), "status", r.Status(), "detail", string(r.Detail()))
		q.s.onGoodbye(synced)
		// Nothing follows a GOODBYE (the target closes the stream), so
		// its receive is not posted again: the QP may already have left
		// RTS, and a failed repost would read as a fault.
		return nil
	}
	return fmt.Errorf("%w: unexpected %s", ErrProtocol, h.Opcode())
}

// slotOf finds the slot a tag names, checking its sequence number.
func (q *conn) slotOf(tag uint32) (*slot, error) {
	k := int(tag & 0xFFFF)
	if k >= len(q.slots) {
		return nil, fmt.Errorf("%w: answer for slot %d of %d", ErrProtocol, k, len(q.slots))
	}
	sl := &q.slots[k]
	if !sl.live() { // also orders the caller's writes before our reads
		return nil, fmt.Errorf("%w: answer with tag %#x for idle slot %d", ErrProtocol, tag, k)
	}
	if uint16(tag>>16) != sl.seq {
		return nil, fmt.Errorf("%w: answer with tag %#x for slot %d at sequence %d", ErrProtocol, tag, k, sl.seq)
	}
	return sl, nil
}

// addFlusher records a completion's Flusher for the end of the batch.
func (q *conn) addFlusher(f Flusher) {
	for _, g := range q.flushers {
		if g == f {
			return
		}
	}
	q.flushers = append(q.flushers, f)
}

// flush flushes the Flushers of the batch's completions.
func (q *conn) flush() {
	for i, f := range q.flushers {
		f.Flush()
		q.flushers[i] = nil
	}
	q.flushers = q.flushers[:0]
}
