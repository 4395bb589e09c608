package initiator

import (
	"context"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// poll runs the QP's completion loop: it reposts receives, advances the
// exchanges and completes atomics, until the QP dies.
func (q *iqp) poll() {
	defer close(q.done)
	var wcs [64]rnic.WC
	ctx := context.Background()
	for {
		n, err := q.cq.Wait(ctx, wcs[:])
		if err != nil {
			q.die(fmt.Errorf("initiator: polling: %w", err), false)
			return
		}
		for i := 0; i < n; i++ {
			wc := &wcs[i]
			if wc.Status != rnic.StatusSuccess {
				flushed := wc.Status == rnic.StatusFlushed // the engine flushes after it stopped
				if wc.Status != rnic.StatusFlushed {
					q.s.c.log.Warn("work request failed: dropping the session", "qp", q.qp.ID(), "err", wc.Err())
				}
				q.die(fmt.Errorf("%w: QP %d: %v", errConnLost, q.qp.ID(), wc.Err()), flushed)
				return
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
				q.s.c.log.Warn("dropping the session", "qp", q.qp.ID(), "err", err)
				q.die(fmt.Errorf("%w: %v", errConnLost, err), false)
				return
			}
		}
	}
}

// onRecv handles one message from the target.
func (q *iqp) onRecv(wc *rnic.WC) error {
	i := int(wc.ID)
	msg := q.rx(i)[:wc.Bytes]
	if wc.HasInvalidated {
		return fmt.Errorf("%w: the target sent a Send with Invalidate", ErrProtocol)
	}
	h, err := blockproto.ParseHeader(msg)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	switch h.Opcode() {
	case blockproto.OpResponse:
		r, err := blockproto.ParseResponse(msg)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		sl, err := q.slotOf(r.Tag())
		if err != nil {
			return err
		}
		err = sl.onResponse(r) // copies what it keeps out of msg
		if rerr := q.repost(i); rerr != nil {
			return rerr
		}
		return err
	case blockproto.OpReady:
		r, err := blockproto.ParseReady(msg)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		var rb [blockproto.ReadyLen]byte
		copy(rb[:], r)
		if err := q.repost(i); err != nil {
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
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		sl, err := q.slotOf(m.Tag())
		if err != nil {
			return err
		}
		err = sl.onData(m) // copies the data out of msg
		if rerr := q.repost(i); rerr != nil {
			return rerr
		}
		return err
	case blockproto.OpGoodbye:
		r, err := blockproto.ParseResponse(msg)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		synced := r.Value() == blockproto.GoodbyeSynced
		q.s.c.log.Info("target says goodbye", "qp", q.qp.ID(), "status", r.Status(), "detail", string(r.Detail()))
		q.goodbye = true
		q.s.onGoodbye(synced)
		return q.repost(i)
	}
	return fmt.Errorf("%w: unexpected %s", ErrProtocol, h.Opcode())
}

// slotOf finds the slot a tag names, checking its sequence number.
func (q *iqp) slotOf(tag uint32) (*islot, error) {
	k := int(tag & 0xFFFF)
	if k >= len(q.slots) {
		return nil, fmt.Errorf("%w: answer for slot %d of %d", ErrProtocol, k, len(q.slots))
	}
	sl := &q.slots[k]
	if st := sl.state.Load(); st != slotInflight && st != slotAbandoned { // also orders the caller's writes before our reads
		return nil, fmt.Errorf("%w: answer with tag %#x for idle slot %d", ErrProtocol, tag, k)
	}
	if uint16(tag>>16) != sl.seq {
		return nil, fmt.Errorf("%w: answer with tag %#x for slot %d at sequence %d", ErrProtocol, tag, k, sl.seq)
	}
	return sl, nil
}
