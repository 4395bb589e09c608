package target

import (
	"context"
	"errors"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

const (
	blk   = store.BlockSize
	minIO = 512
)

func alignUp(v, a uint64) uint64 { return (v + a - 1) / a * a }

// storeStatus maps a store error to a protocol status.
func storeStatus(err error) blockproto.Status {
	switch {
	case errors.Is(err, store.ErrOutOfRange):
		return blockproto.StatusRange
	case errors.Is(err, store.ErrChecksum):
		return blockproto.StatusChecksum
	case errors.Is(err, store.ErrInvalid):
		return blockproto.StatusInvalid
	case errors.Is(err, store.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return blockproto.StatusShutdown
	}
	return blockproto.StatusIO
}

// checkIO validates a byte range: 512-byte alignment, at most max bytes
// (max 0: any), inside the volume.
func (q *qconn) checkIO(off uint64, n uint32, max int) blockproto.Status {
	switch {
	case off%minIO != 0 || n%minIO != 0:
		return blockproto.StatusInvalid
	case max > 0 && int(n) > max:
		return blockproto.StatusTooLarge
	case off+uint64(n) > uint64(q.sess.vol.size.Load()):
		return blockproto.StatusRange
	}
	return blockproto.StatusOK
}

// execute runs the slot's command (worker goroutine).
func (q *qconn) execute(s *slot) {
	c := blockproto.Command(s.cmd[:])
	switch c.Op() {
	case blockproto.OpRead:
		q.doRead(s, c)
	case blockproto.OpWrite:
		q.doWrite(s, c)
	case blockproto.OpWriteReq:
		q.doWriteReq(s, c)
	case blockproto.OpFlush:
		st := blockproto.StatusOK
		if err := q.sess.vol.v.Flush(q.ctx); err != nil {
			if q.t.storeFailed(q.sess.vol, err) {
				return // not answered: replayed at the target that took over
			}
			st = storeStatus(err)
			q.log.Error("flush failed", "volume", q.sess.vol.name, "err", err)
		}
		q.answer(s, st, 0, "")
		q.t.m.done(OpFlush, s.began, st != blockproto.StatusOK)
	case blockproto.OpTrim, blockproto.OpWriteZeroes:
		q.doDiscard(s, c)
	case blockproto.OpHolder:
		var id uint64
		name := ""
		if h := q.sess.vol.holder(uint8(c.Offset())); h != nil {
			id, name = h.id, h.name
		}
		q.answer(s, blockproto.StatusOK, id, name)
	}
}

func (q *qconn) doRead(s *slot, c blockproto.Command) {
	if c.Inline() {
		q.doReadInline(s, c)
		return
	}
	off, n := c.Offset(), c.Length()
	if st := q.checkIO(off, n, q.t.cfg.MaxTransfer); st != blockproto.StatusOK {
		q.t.m.done(OpRead, s.began, true)
		q.answer(s, st, 0, "")
		return
	}
	head := off % blk
	span := alignUp(head+uint64(n), blk)
	buf, err := q.t.pool.get(q.ctx, int(span))
	if err != nil {
		return // teardown
	}
	if err := q.sess.vol.v.ReadBlocks(q.ctx, off/blk, buf[:span]); err != nil {
		q.t.pool.put(buf)
		if q.t.storeFailed(q.sess.vol, err) {
			return // not answered: replayed at the target that took over
		}
		st := storeStatus(err)
		q.log.Warn("read failed", "volume", q.sess.vol.name, "offset", off, "length", n, "err", err)
		q.t.m.done(OpRead, s.began, true)
		q.answer(s, st, 0, err.Error())
		return
	}
	q.t.m.BytesRead.Add(uint64(n))
	q.t.m.done(OpRead, s.began, false)
	q.ready(s, buf, int(head), int(n), rnic.LocalRead|rnic.RemoteRead, slotAwaitRelease)
}

// doReadInline answers a READ with FlagInline: the data, read (and its
// blocks' checksums verified) by the store, goes in a DATA from the slot's
// DATA area; whole blocks are read straight into it.
func (q *qconn) doReadInline(s *slot, c blockproto.Command) {
	off, n := c.Offset(), c.Length()
	st := q.checkIO(off, n, q.t.cfg.MaxTransfer)
	if st == blockproto.StatusOK && int(n) > q.inline {
		st = blockproto.StatusTooLarge // also when the QP has no inline reads
	}
	if st != blockproto.StatusOK {
		q.t.m.done(OpRead, s.began, true)
		q.answer(s, st, 0, "")
		return
	}
	area := q.dataArea(s.idx)
	payload := area[blockproto.DataFixedLen:]
	head := off % blk
	var err error
	if head == 0 && n%blk == 0 {
		err = q.sess.vol.v.ReadBlocks(q.ctx, off/blk, payload[:n])
	} else {
		span := alignUp(head+uint64(n), blk)
		var buf []byte
		if buf, err = q.t.pool.get(q.ctx, int(span)); err != nil {
			return // teardown
		}
		if err = q.sess.vol.v.ReadBlocks(q.ctx, off/blk, buf[:span]); err == nil {
			copy(payload, buf[head:head+uint64(n)])
		}
		q.t.pool.put(buf)
	}
	if err != nil {
		if q.t.storeFailed(q.sess.vol, err) {
			return // not answered: replayed at the target that took over
		}
		q.log.Warn("read failed", "volume", q.sess.vol.name, "offset", off, "length", n, "err", err)
		q.t.m.done(OpRead, s.began, true)
		q.answer(s, storeStatus(err), 0, err.Error())
		return
	}
	// The counters first: the DATA frees the slot.
	q.t.m.InlineReads.Add(1)
	q.t.m.BytesRead.Add(uint64(n))
	q.t.m.done(OpRead, s.began, false)
	q.sendData(s, area, n)
}

func (q *qconn) doWriteReq(s *slot, c blockproto.Command) {
	off, n := c.Offset(), c.Length()
	st := q.checkIO(off, n, q.t.cfg.MaxTransfer)
	if st == blockproto.StatusOK && q.sess.vol.readOnly {
		st = blockproto.StatusReadOnly
	}
	if st != blockproto.StatusOK {
		q.answer(s, st, 0, "")
		q.t.m.done(OpWrite, s.began, true)
		return
	}
	head := off % blk
	span := alignUp(head+uint64(n), blk)
	buf, err := q.t.pool.get(q.ctx, int(span))
	if err != nil {
		return
	}
	s.reqOff, s.reqLen = off, n
	q.t.m.TwoStepWrites.Add(1)
	q.ready(s, buf, int(head), int(n), rnic.LocalWrite|rnic.RemoteWrite, slotAwaitWrite)
}

func (q *qconn) doWrite(s *slot, c blockproto.Command) {
	off, n := c.Offset(), c.Length()
	st := q.checkIO(off, n, q.t.cfg.MaxTransfer)
	var buf, pooled []byte
	g := s.grant
	s.grant = nil
	if g != nil {
		switch {
		case st != blockproto.StatusOK:
		case int(n) > len(g.buf):
			st = blockproto.StatusInvalid
		case off%blk == 0 && n%blk == 0:
			buf = g.buf
		default: // unaligned: move the data to its place among whole blocks
			span := alignUp(off%blk+uint64(n), blk)
			var err error
			if pooled, err = q.t.pool.get(q.ctx, int(span)); err != nil {
				q.grants.putIdle(g)
				return // teardown
			}
			copy(pooled[off%blk:], g.buf[:n])
			buf = pooled
		}
	} else {
		s.mu.Lock()
		pooled, s.buf = s.buf, nil
		s.mu.Unlock()
		buf = pooled
		if st == blockproto.StatusOK && (off != s.reqOff || n != s.reqLen) {
			st = blockproto.StatusInvalid
		}
	}
	var chk mutationCheck
	if st == blockproto.StatusOK {
		chk = q.storeWrite(s, off, buf, int(n), c.FUA(), c.Token())
		st = chk.status
	}
	q.t.pool.put(pooled)
	if g != nil {
		q.grants.putIdle(g) // before the answer, which advertises it again
	}
	if chk.fenced {
		return // not answered: replayed at the target that took over
	}
	q.noteMutation(st)
	q.answer(s, st, chk.value, chk.detail)
	if st == blockproto.StatusOK {
		q.t.m.BytesWrit.Add(uint64(n))
	}
	q.t.m.done(OpWrite, s.began, st != blockproto.StatusOK)
}

func (q *qconn) noteMutation(st blockproto.Status) {
	switch st {
	case blockproto.StatusStaleToken:
		q.t.m.StaleTokens.Add(1)
	case blockproto.StatusReserved:
		q.t.m.ReservedFails.Add(1)
	}
}

// storeWrite writes n bytes at off found at buf[off%4096:], buf having
// room for whole blocks: the partial edge blocks are filled from the
// store (read-modify-write) under exclusive stripe locks. The reservation
// and fencing checks and the write happen under the volume's fence lock.
func (q *qconn) storeWrite(s *slot, off uint64, buf []byte, n int, fua bool, token uint64) mutationCheck {
	vol := q.sess.vol
	head := int(off % blk)
	end := off + uint64(n)
	first, last := off/blk, (end-1)/blk
	count := last - first + 1
	pFirst, pLast := head != 0, end%blk != 0
	vol.fence.RLock()
	defer vol.fence.RUnlock()
	if chk := vol.checkMutation(q.sess.slot, token); chk.status != blockproto.StatusOK {
		return chk
	}
	r := vol.lockBlocks(first, count, pFirst, pLast)
	defer r.unlock()
	span := buf[:count*blk]
	if pFirst {
		if err := vol.v.ReadBlocks(q.ctx, first, s.scratch); err != nil {
			return q.ioFailed("read-modify-write read", off, n, err)
		}
		copy(span[:head], s.scratch[:head])
		if count == 1 && pLast {
			copy(span[head+n:blk], s.scratch[head+n:])
		}
	}
	if pLast && !(count == 1 && pFirst) {
		if err := vol.v.ReadBlocks(q.ctx, last, s.scratch); err != nil {
			return q.ioFailed("read-modify-write read", off, n, err)
		}
		t := int(end % blk)
		copy(span[(count-1)*blk+uint64(t):], s.scratch[t:])
	}
	if err := vol.v.WriteBlocks(q.ctx, first, span, fua); err != nil {
		return q.ioFailed("write", off, n, err)
	}
	return mutationCheck{}
}

func (q *qconn) ioFailed(what string, off uint64, n int, err error) mutationCheck {
	if q.t.storeFailed(q.sess.vol, err) {
		return mutationCheck{status: blockproto.StatusIO, fenced: true}
	}
	q.log.Warn(what+" failed", "volume", q.sess.vol.name, "offset", off, "length", n, "err", err)
	return mutationCheck{status: storeStatus(err), detail: err.Error()}
}

// doDiscard runs TRIM and WRITE_ZEROES.
func (q *qconn) doDiscard(s *slot, c blockproto.Command) {
	kind := OpTrim
	if c.Op() == blockproto.OpWriteZeroes {
		kind = OpWriteZeroes
	}
	off, n := c.Offset(), c.Length()
	chk := mutationCheck{status: q.checkIO(off, n, 0)}
	if chk.status == blockproto.StatusOK {
		chk = q.discard(s, kind, off, uint64(n), c.FUA(), c.Token())
	}
	if chk.fenced {
		return // not answered: replayed at the target that took over
	}
	q.noteMutation(chk.status)
	q.answer(s, chk.status, chk.value, chk.detail)
	q.t.m.done(kind, s.began, chk.status != blockproto.StatusOK)
}

// discard trims (whole blocks only) or zeroes a range.
func (q *qconn) discard(s *slot, kind OpKind, off, n uint64, fua bool, token uint64) mutationCheck {
	vol := q.sess.vol
	end := off + n
	first, last := off/blk, (end-1)/blk
	fullFirst, fullEnd := alignUp(off, blk)/blk, end/blk // whole blocks [fullFirst, fullEnd)
	pFirst, pLast := off%blk != 0, end%blk != 0
	vol.fence.RLock()
	defer vol.fence.RUnlock()
	if chk := vol.checkMutation(q.sess.slot, token); chk.status != blockproto.StatusOK {
		return chk
	}
	if kind == OpTrim {
		if fullEnd <= fullFirst {
			return mutationCheck{}
		}
		r := vol.lockBlocks(fullFirst, fullEnd-fullFirst, false, false)
		defer r.unlock()
		if err := vol.v.Trim(q.ctx, fullFirst, fullEnd-fullFirst); err != nil {
			return q.ioFailed("trim", off, int(n), err)
		}
		return mutationCheck{}
	}
	r := vol.lockBlocks(first, last-first+1, pFirst, pLast)
	defer r.unlock()
	if fullEnd > fullFirst {
		if err := vol.v.WriteZeroes(q.ctx, fullFirst, fullEnd-fullFirst, fua); err != nil {
			return q.ioFailed("write-zeroes", off, int(n), err)
		}
	}
	// Partial edge blocks: zero the covered part (one block if the range
	// lies inside a single block).
	zeroPart := func(b, from, to uint64) error {
		if err := vol.v.ReadBlocks(q.ctx, b, s.scratch); err != nil {
			return err
		}
		clear(s.scratch[from:to])
		return vol.v.WriteBlocks(q.ctx, b, s.scratch, fua)
	}
	if first == last && (pFirst || pLast) {
		if err := zeroPart(first, off%blk, off%blk+n); err != nil {
			return q.ioFailed("write-zeroes edge", off, int(n), err)
		}
		return mutationCheck{}
	}
	if pFirst {
		if err := zeroPart(first, off%blk, blk); err != nil {
			return q.ioFailed("write-zeroes edge", off, int(n), err)
		}
	}
	if pLast {
		if err := zeroPart(last, 0, end%blk); err != nil {
			return q.ioFailed("write-zeroes edge", off, int(n), err)
		}
	}
	return mutationCheck{}
}
