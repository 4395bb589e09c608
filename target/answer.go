package target

import (
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// attachGrant fast-registers an idle grant with a fresh key, adds the
// Fast-Register to the slot's work requests and describes the grant in
// dst. It reports how many work requests it added (0 or 1).
func (c *conn) attachGrant(s *slot, dst *blockproto.GrantFields) int {
	if c.isDead() {
		return 0
	}
	g := c.grants.next()
	if g == nil {
		return 0
	}
	st := g.mr.STag()
	st = st.WithKey(freshKey(c.t.dev, st))
	s.gfr = rnic.FastReg{STag: st, Mem: rnic.Memory{Pages: g.pages[:], Len: uint64(len(g.buf))}, ZeroBased: true,
		Access: rnic.LocalWrite | rnic.RemoteWrite}
	s.wrs[0] = rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &s.gfr}
	c.grants.advertise(g, st)
	c.t.m.GrantsIssued.Add(1)
	*dst = blockproto.GrantFields{STag: uint32(st), Len: uint32(len(g.buf))}
	return 1
}

// post sends the slot's first n work requests; a failure means the QP is
// going away (the loop ends the session).
func (c *conn) post(s *slot, n int) {
	if _, err := c.QP.PostSend(s.wrs[:n]...); err != nil {
		c.markDead()
	}
}

// sendWR sets work request i of the slot to an unsignaled Send of the
// first n bytes of the slot's send area.
func (c *conn) sendWR(s *slot, i, n int) {
	s.sge[0] = c.AreaSGE(s.idx, n)
	s.wrs[i] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: s.sge[:]}
}

// free ends the slot's exchange: the slot takes the next command.
func (s *slot) free() {
	s.mu.Lock()
	s.state = slotFree
	s.mu.Unlock()
}

// finish ends the slot's exchange with its first n WRs, the answer last.
// The slot is free before the post: an initiator may send the next
// command as soon as it has the answer, which can be before PostSend
// returns. The mark held here and set by the post lets onRecv refuse a
// command that comes before the answer left (answerSent).
func (c *conn) finish(s *slot, n int) {
	s.mu.Lock()
	s.state = slotFree
	s.ans.Hold()
	s.ansLast = n - 1
	s.mu.Unlock()
	if h := c.afterFree.Load(); h != nil {
		(*h)(s)
	}
	if _, err := c.QP.PostSendMarked(&s.ans, s.wrs[:n]...); err != nil {
		c.markDead()
	}
}

// answer ends the slot's exchange with a RESPONSE (and a grant if one is
// idle).
func (c *conn) answer(s *slot, st blockproto.Status, value uint64, detail string) {
	f := blockproto.ResponseFields{Op: blockproto.OpResponse, Tag: blockproto.Command(s.cmd[:]).Tag(), Status: st,
		Value: value, Detail: detail}
	n := c.attachGrant(s, &f.Grant)
	m, err := blockproto.EncodeResponse(c.Area(s.idx), &f)
	if err != nil {
		// The area is MaxMessage bytes and the detail is cut to fit, so
		// only a bug gets here; the command still gets an answer.
		c.log.Error("encoding a response: answering with an I/O error", "status", st, "err", err)
		f.Status, f.Value, f.Detail = blockproto.StatusIO, 0, ""
		if m, err = blockproto.EncodeResponse(c.Area(s.idx), &f); err != nil {
			c.log.Error("encoding a response: ending the session", "err", err)
			s.free()
			c.markDead()
			c.Reset() // the handler sees the end; the initiator replays the command on a new session
			return
		}
	}
	c.sendWR(s, n, len(m))
	c.finish(s, n+1)
}

// ready registers buf[head:head+n] under the slot's STag with a fresh key
// and access acc, and sends READY naming it; the slot then waits in next
// (slotAwaitRelease or slotAwaitWrite) under a lease. The lease starts
// once the Fast-Register is posted: expire posts its Invalidate behind it.
func (c *conn) ready(s *slot, buf []byte, head, n int, acc rnic.Access, next slotState) {
	f := blockproto.ReadyFields{Tag: blockproto.Command(s.cmd[:]).Tag()}
	k := c.attachGrant(s, &f.Grant)
	st := s.stag.WithKey(freshKey(c.t.dev, s.stag))
	s.pages[0] = buf[head : head+n]
	s.fr = rnic.FastReg{STag: st, Mem: rnic.Memory{Pages: s.pages[:], Len: uint64(n)}, ZeroBased: true, Access: acc}
	s.wrs[k] = rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &s.fr}
	f.Buffer = blockproto.GrantFields{STag: uint32(st), Len: uint32(n)}
	m := blockproto.EncodeReady(c.Area(s.idx), &f)
	c.sendWR(s, k+1, len(m))
	s.mu.Lock()
	s.buf, s.head, s.stag, s.state = buf, head, st, next
	// A lease timer of an earlier exchange may fire before this one's is
	// armed (it was stopped too late, or the test calls expire): it must
	// find a deadline still ahead, not the last exchange's.
	s.deadline = time.Now().Add(c.t.cfg.ReadLease)
	s.mu.Unlock()
	c.post(s, k+2)
	s.mu.Lock()
	// The initiator may have ended the exchange already (RELEASE, or the
	// WRITE of a WRITE_REQ): no lease then.
	if s.state == next && s.stag == st {
		s.armLeaseLocked()
	}
	s.mu.Unlock()
}

// sendData ends the slot's exchange with a DATA carrying the n bytes
// already in its DATA area (and a grant if one is idle).
func (c *conn) sendData(s *slot, area []byte, n uint32) {
	if n == 0 || n > blockproto.MaxInline || blockproto.DataLen(int(n)) > len(area) {
		// n is at most the QP's inline size: only a bug gets here.
		c.log.Error("a DATA that cannot be encoded: answering with an I/O error", "length", n, "area", len(area))
		c.answer(s, blockproto.StatusIO, 0, "")
		return
	}
	f := blockproto.DataFields{Tag: blockproto.Command(s.cmd[:]).Tag(), Len: n}
	k := c.attachGrant(s, &f.Grant)
	m, _ := blockproto.EncodeData(area, &f) // cannot fail: checked above
	s.sge[0] = c.dataSGE(s.idx, len(m))
	s.wrs[k] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: s.sge[:]}
	c.finish(s, k+1)
}

// sendExtents ends the slot's exchange with an EXTENTS (and a grant if one
// is idle).
func (c *conn) sendExtents(s *slot, ext []blockproto.ExtentFields) {
	if len(ext) == 0 || len(ext) > blockproto.MaxExtents {
		c.log.Error("an EXTENTS that cannot be encoded: answering with an I/O error", "extents", len(ext))
		c.answer(s, blockproto.StatusIO, 0, "")
		return
	}
	f := blockproto.ExtentsFields{Tag: blockproto.Command(s.cmd[:]).Tag(), Extents: ext}
	k := c.attachGrant(s, &f.Grant)
	m, _ := blockproto.EncodeExtents(c.Area(s.idx), &f) // cannot fail: checked above
	c.sendWR(s, k, len(m))
	c.finish(s, k+1)
}
