package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	case errors.Is(err, store.ErrNoSpace):
		return blockproto.StatusNoSpace
	case errors.Is(err, store.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return blockproto.StatusShutdown
	}
	return blockproto.StatusIO
}

// checkIO validates a byte range: 512-byte alignment, at most max bytes
// (max 0: any), inside the volume.
func (c *conn) checkIO(off uint64, n uint32, max int) blockproto.Status {
	switch {
	case off%minIO != 0 || n%minIO != 0:
		return blockproto.StatusInvalid
	case max > 0 && int(n) > max:
		return blockproto.StatusTooLarge
	case off+uint64(n) > uint64(c.sess.vol.size.Load()):
		return blockproto.StatusRange
	}
	return blockproto.StatusOK
}

// execute runs the slot's command (worker goroutine).
func (c *conn) execute(s *slot) {
	m := blockproto.Command(s.cmd[:])
	switch m.Op() {
	case blockproto.OpRead:
		c.doRead(s, m)
	case blockproto.OpWrite:
		c.doWrite(s, m)
	case blockproto.OpWriteReq:
		c.doWriteReq(s, m)
	case blockproto.OpFlush:
		st := blockproto.StatusOK
		if err := c.sess.vol.v.Flush(c.Context()); err != nil {
			if c.t.storeFailed(c.sess.vol, err) {
				return // not answered: replayed at the target that took over
			}
			st = storeStatus(err)
			c.log.Error("flush failed", "volume", c.sess.vol.name, "err", err)
		}
		// Counted before the answer, so that whoever sees the answer
		// sees the count (the tests read the metrics right after).
		c.t.m.done(OpFlush, s.began, st != blockproto.StatusOK)
		c.answer(s, st, 0, "")
	case blockproto.OpTrim, blockproto.OpWriteZeroes:
		c.doDiscard(s, m)
	case blockproto.OpBlockStatus:
		c.doBlockStatus(s, m)
	case blockproto.OpHolder:
		var id uint64
		name := ""
		if h := c.sess.vol.holder(uint8(m.Offset())); h != nil {
			id, name = h.id, h.name
		}
		c.answer(s, blockproto.StatusOK, id, name)
	}
}

func (c *conn) doRead(s *slot, m blockproto.Command) {
	if m.Inline() {
		c.doReadInline(s, m)
		return
	}
	off, n := m.Offset(), m.Length()
	if st := c.checkIO(off, n, c.t.cfg.MaxTransfer); st != blockproto.StatusOK {
		c.t.m.done(OpRead, s.began, true)
		c.answer(s, st, 0, "")
		return
	}
	head := off % blk
	span := alignUp(head+uint64(n), blk)
	buf, err := c.t.pool.Get(c.Context(), int(span))
	if err != nil {
		return // teardown
	}
	if err := c.sess.vol.v.ReadBlocks(c.Context(), off/blk, buf[:span]); err != nil {
		c.t.pool.Put(buf)
		if c.t.storeFailed(c.sess.vol, err) {
			return // not answered: replayed at the target that took over
		}
		st := storeStatus(err)
		c.log.Warn("read failed", "volume", c.sess.vol.name, "offset", off, "length", n, "err", err)
		c.t.m.done(OpRead, s.began, true)
		c.answer(s, st, 0, err.Error())
		return
	}
	c.t.m.BytesRead.Add(uint64(n))
	c.t.m.done(OpRead, s.began, false)
	c.ready(s, buf, int(head), int(n), rnic.LocalRead|rnic.RemoteRead, slotAwaitRelease)
}

// doReadInline answers a READ with FlagInline: the data, read (and its
// blocks' checksums verified) by the store, goes in a DATA from the slot's
// DATA area; whole blocks are read straight into it.
func (c *conn) doReadInline(s *slot, m blockproto.Command) {
	off, n := m.Offset(), m.Length()
	st := c.checkIO(off, n, c.t.cfg.MaxTransfer)
	if st == blockproto.StatusOK && int(n) > c.inline {
		st = blockproto.StatusTooLarge // also when the QP has no inline reads
	}
	if st != blockproto.StatusOK {
		c.t.m.done(OpRead, s.began, true)
		c.answer(s, st, 0, "")
		return
	}
	area := c.dataArea(s.idx)
	payload := area[blockproto.DataFixedLen:]
	head := off % blk
	var err error
	if head == 0 && n%blk == 0 {
		err = c.sess.vol.v.ReadBlocks(c.Context(), off/blk, payload[:n])
	} else {
		span := alignUp(head+uint64(n), blk)
		var buf []byte
		if buf, err = c.t.pool.Get(c.Context(), int(span)); err != nil {
			return // teardown
		}
		if err = c.sess.vol.v.ReadBlocks(c.Context(), off/blk, buf[:span]); err == nil {
			copy(payload, buf[head:head+uint64(n)])
		}
		c.t.pool.Put(buf)
	}
	if err != nil {
		if c.t.storeFailed(c.sess.vol, err) {
			return // not answered: replayed at the target that took over
		}
		c.log.Warn("read failed", "volume", c.sess.vol.name, "offset", off, "length", n, "err", err)
		c.t.m.done(OpRead, s.began, true)
		c.answer(s, storeStatus(err), 0, err.Error())
		return
	}
	c.sendInlineRead(s, area, n)
}

// sendInlineRead answers an inline READ whose n bytes of data are in the
// slot's DATA area.
func (c *conn) sendInlineRead(s *slot, area []byte, n uint32) {
	// The counters first: the DATA frees the slot.
	c.t.m.InlineReads.Add(1)
	c.t.m.BytesRead.Add(uint64(n))
	c.t.m.done(OpRead, s.began, false)
	c.sendData(s, area, n)
}

func (c *conn) doWriteReq(s *slot, m blockproto.Command) {
	off, n := m.Offset(), m.Length()
	st := c.checkIO(off, n, c.t.cfg.MaxTransfer)
	if st == blockproto.StatusOK && c.sess.vol.readOnly {
		st = blockproto.StatusReadOnly
	}
	if st != blockproto.StatusOK {
		c.t.m.done(OpWrite, s.began, true)
		c.answer(s, st, 0, "")
		return
	}
	head := off % blk
	span := alignUp(head+uint64(n), blk)
	buf, err := c.t.pool.Get(c.Context(), int(span))
	if err != nil {
		return
	}
	s.reqOff, s.reqLen = off, n
	c.t.m.TwoStepWrites.Add(1)
	c.ready(s, buf, int(head), int(n), rnic.LocalWrite|rnic.RemoteWrite, slotAwaitWrite)
}

func (c *conn) doWrite(s *slot, m blockproto.Command) {
	off, n := m.Offset(), m.Length()
	st := c.checkIO(off, n, c.t.cfg.MaxTransfer)
	detail := ""
	var buf, pooled []byte
	g := s.grant
	s.grant = nil
	if g != nil {
		switch {
		case st != blockproto.StatusOK:
		case int(n) > len(g.buf):
			st = blockproto.StatusInvalid
		case g.mr.Placed() < uint64(n):
			st, detail = blockproto.StatusInvalid, notPlaced(g.mr.Placed(), n)
		case off%blk == 0 && n%blk == 0:
			buf = g.buf
		default: // unaligned: move the data to its place among whole blocks
			span := alignUp(off%blk+uint64(n), blk)
			var err error
			if pooled, err = c.t.pool.Get(c.Context(), int(span)); err != nil {
				c.grants.putIdle(g)
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
		switch {
		case st != blockproto.StatusOK:
		case off != s.reqOff || n != s.reqLen:
			st = blockproto.StatusInvalid
		case s.mr.Placed() < uint64(n):
			st, detail = blockproto.StatusInvalid, notPlaced(s.mr.Placed(), n)
		}
	}
	chk := mutationCheck{status: st, detail: detail}
	if st == blockproto.StatusOK {
		chk = c.storeWrite(s, off, buf, int(n), m.FUA(), m.Token())
		st = chk.status
	}
	c.t.pool.Put(pooled)
	if g != nil {
		c.grants.putIdle(g) // before the answer, which advertises it again
	}
	if chk.fenced {
		return // not answered: replayed at the target that took over
	}
	c.noteMutation(st)
	if st == blockproto.StatusOK {
		c.t.m.BytesWrit.Add(uint64(n))
	}
	c.t.m.done(OpWrite, s.began, st != blockproto.StatusOK)
	c.answer(s, st, chk.value, chk.detail)
}

// notPlaced is the detail of a WRITE refused because its buffer does not
// hold n bytes the initiator placed: a pooled buffer holds what its last
// user left there (another session's READ of another volume, say), so
// only bytes placed since the buffer was registered are ever stored.
func notPlaced(placed uint64, n uint32) string {
	return fmt.Sprintf("the WRITE's data was not placed in full: %d of %d bytes written in order from the buffer's start", placed, n)
}

func (c *conn) noteMutation(st blockproto.Status) {
	switch st {
	case blockproto.StatusStaleToken:
		c.t.m.StaleTokens.Add(1)
	case blockproto.StatusReserved:
		c.t.m.ReservedFails.Add(1)
	}
}

// storeWrite writes n bytes at off found at buf[off%4096:], buf having
// room for whole blocks: the partial edge blocks are filled from the
// store (read-modify-write) under exclusive stripe locks. The reservation
// and fencing checks and the write happen under the volume's fence lock.
func (c *conn) storeWrite(s *slot, off uint64, buf []byte, n int, fua bool, token uint64) mutationCheck {
	vol := c.sess.vol
	head := int(off % blk)
	end := off + uint64(n)
	first, last := off/blk, (end-1)/blk
	count := last - first + 1
	pFirst, pLast := head != 0, end%blk != 0
	vol.fence.RLock()
	defer vol.fence.RUnlock()
	if chk := vol.checkMutation(c.sess.slot, token); chk.status != blockproto.StatusOK {
		return chk
	}
	r := vol.lockBlocks(first, count, pFirst, pLast)
	defer r.unlock()
	span := buf[:count*blk]
	if pFirst {
		if err := vol.v.ReadBlocks(c.Context(), first, s.scratch); err != nil {
			return c.ioFailed("read-modify-write read", off, n, err)
		}
		copy(span[:head], s.scratch[:head])
		if count == 1 && pLast {
			copy(span[head+n:blk], s.scratch[head+n:])
		}
	}
	if pLast && !(count == 1 && pFirst) {
		if err := vol.v.ReadBlocks(c.Context(), last, s.scratch); err != nil {
			return c.ioFailed("read-modify-write read", off, n, err)
		}
		t := int(end % blk)
		copy(span[(count-1)*blk+uint64(t):], s.scratch[t:])
	}
	if err := vol.v.WriteBlocks(c.Context(), first, span, fua); err != nil {
		return c.ioFailed("write", off, n, err)
	}
	return mutationCheck{}
}

func (c *conn) ioFailed(what string, off uint64, n int, err error) mutationCheck {
	if c.t.storeFailed(c.sess.vol, err) {
		return mutationCheck{status: blockproto.StatusIO, fenced: true}
	}
	lvl := slog.LevelWarn
	if errors.Is(err, store.ErrNoSpace) {
		// The store said so once when its file system filled; the
		// initiator gets ENOSPC for each write.
		lvl = slog.LevelDebug
	}
	c.log.Log(c.Context(), lvl, what+" failed", "volume", c.sess.vol.name, "offset", off, "length", n, "err", err)
	return mutationCheck{status: storeStatus(err), detail: err.Error()}
}

// doDiscard runs TRIM and WRITE_ZEROES.
func (c *conn) doDiscard(s *slot, m blockproto.Command) {
	kind := OpTrim
	if m.Op() == blockproto.OpWriteZeroes {
		kind = OpWriteZeroes
	}
	off, n := m.Offset(), m.Length()
	chk := mutationCheck{status: c.checkIO(off, n, 0)}
	if chk.status == blockproto.StatusOK && m.NoHole() && !c.noHole {
		chk.status = blockproto.StatusInvalid // the WELCOME did not grant it
	}
	if chk.status == blockproto.StatusOK {
		chk = c.discard(s, kind, off, uint64(n), m.FUA(), m.NoHole(), m.Token())
	}
	if chk.fenced {
		return // not answered: replayed at the target that took over
	}
	c.noteMutation(chk.status)
	c.t.m.done(kind, s.began, chk.status != blockproto.StatusOK)
	c.answer(s, chk.status, chk.value, chk.detail)
}

// discard trims (whole blocks only) or zeroes a range; with noHole the
// zeroed blocks stay allocated (WriteZeroesAllocated; the partial edge
// blocks are written, which allocates them too).
func (c *conn) discard(s *slot, kind OpKind, off, n uint64, fua, noHole bool, token uint64) mutationCheck {
	vol := c.sess.vol
	end := off + n
	first, last := off/blk, (end-1)/blk
	fullFirst, fullEnd := alignUp(off, blk)/blk, end/blk // whole blocks [fullFirst, fullEnd)
	pFirst, pLast := off%blk != 0, end%blk != 0
	vol.fence.RLock()
	defer vol.fence.RUnlock()
	if chk := vol.checkMutation(c.sess.slot, token); chk.status != blockproto.StatusOK {
		return chk
	}
	if kind == OpTrim {
		if fullEnd <= fullFirst {
			return mutationCheck{}
		}
		r := vol.lockBlocks(fullFirst, fullEnd-fullFirst, false, false)
		defer r.unlock()
		if err := vol.v.Trim(c.Context(), fullFirst, fullEnd-fullFirst); err != nil {
			return c.ioFailed("trim", off, int(n), err)
		}
		return mutationCheck{}
	}
	r := vol.lockBlocks(first, last-first+1, pFirst, pLast)
	defer r.unlock()
	if fullEnd > fullFirst {
		zero, what := vol.v.WriteZeroes, "write-zeroes"
		if noHole {
			zero, what = vol.v.WriteZeroesAllocated, "write-zeroes allocated"
		}
		if err := zero(c.Context(), fullFirst, fullEnd-fullFirst, fua); err != nil {
			return c.ioFailed(what, off, int(n), err)
		}
	}
	// Partial edge blocks: zero the covered part (one block if the range
	// lies inside a single block).
	zeroPart := func(b, from, to uint64) error {
		if err := vol.v.ReadBlocks(c.Context(), b, s.scratch); err != nil {
			return err
		}
		clear(s.scratch[from:to])
		return vol.v.WriteBlocks(c.Context(), b, s.scratch, fua)
	}
	if first == last && (pFirst || pLast) {
		if err := zeroPart(first, off%blk, off%blk+n); err != nil {
			return c.ioFailed("write-zeroes edge", off, int(n), err)
		}
		return mutationCheck{}
	}
	if pFirst {
		if err := zeroPart(first, off%blk, blk); err != nil {
			return c.ioFailed("write-zeroes edge", off, int(n), err)
		}
	}
	if pLast {
		if err := zeroPart(last, 0, end%blk); err != nil {
			return c.ioFailed("write-zeroes edge", off, int(n), err)
		}
	}
	return mutationCheck{}
}

// doBlockStatus answers a BLOCK_STATUS with the allocation of the range
// from its offset on, as the store reports it, in at most MaxExtents
// descriptors; an unaligned start or end is rounded out to whole blocks
// and the descriptors clipped back to the range.
func (c *conn) doBlockStatus(s *slot, m blockproto.Command) {
	off, n := m.Offset(), m.Length()
	st := c.checkIO(off, n, 0)
	if st == blockproto.StatusOK && !c.extents {
		st = blockproto.StatusInvalid
	}
	if st != blockproto.StatusOK {
		c.answer(s, st, 0, "")
		return
	}
	var ext [blockproto.MaxExtents]blockproto.ExtentFields
	k := 0
	end := off + uint64(n)
	first := off / blk
	err := c.sess.vol.v.BlockStatus(c.Context(), first, (end+blk-1)/blk-first, func(e store.Extent) bool {
		lo, hi := max(e.LBA*blk, off), min((e.LBA+e.Count)*blk, end)
		if hi <= lo {
			return true
		}
		for hi > lo {
			if k == len(ext) {
				return false
			}
			piece := min(hi-lo, 1<<32-blk) // a descriptor's length is 32 bits
			flags := uint32(0)
			if e.Hole {
				flags = blockproto.ExtentHole | blockproto.ExtentZero
			}
			if k > 0 && ext[k-1].Flags == flags && uint64(ext[k-1].Length)+piece < 1<<32 {
				ext[k-1].Length += uint32(piece)
			} else {
				ext[k] = blockproto.ExtentFields{Length: uint32(piece), Flags: flags}
				k++
			}
			lo += piece
		}
		return true
	})
	if err != nil {
		if c.t.storeFailed(c.sess.vol, err) {
			return // not answered: replayed at the target that took over
		}
		c.log.Warn("block status failed", "volume", c.sess.vol.name, "offset", off, "length", n, "err", err)
		c.answer(s, storeStatus(err), 0, err.Error())
		return
	}
	if k == 0 {
		c.answer(s, blockproto.StatusIO, 0, "the store reported no extent")
		return
	}
	c.sendExtents(s, ext[:k])
}
