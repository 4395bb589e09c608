package target

import (
	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// attachGrant fast-registers an idle grant with a fresh key, adds the
// Fast-Register to the slot's work requests and describes the grant in
// dst. It reports how many work requests it added (0 or 1).
func (q *qconn) attachGrant(s *slot, dst *blockproto.GrantFields) int {
	if q.isDead() {
		return 0
	}
	g := q.grants.next()
	if g == nil {
		return 0
	}
	st := g.mr.STag()
	st = st.WithKey(freshKey(q.t.dev, st))
	s.gfr = rnic.FastReg{STag: st, Mem: rnic.Memory{Pages: g.pages[:], Len: uint64(len(g.buf))}, ZeroBased: true,
		Access: rnic.LocalWrite | rnic.RemoteWrite}
	s.wrs[0] = rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &s.gfr}
	q.grants.advertise(g, st)
	q.t.m.GrantsIssued.Add(1)
	*dst = blockproto.GrantFields{STag: uint32(st), Len: uint32(len(g.buf))}
	return 1
}

// post sends the slot's first n work requests; a failure means the QP is
// going away (the poller ends the session).
func (q *qconn) post(s *slot, n int) {
	if _, err := q.qp.PostSend(s.wrs[:n]...); err != nil {
		q.markDead()
	}
}

// sendWR sets work request i of the slot to an unsignaled Send of the
// slot's message area.
func (q *qconn) sendWR(s *slot, i, n int) {
	s.sge[0] = q.txSGE(s.idx, n)
	s.wrs[i] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: s.sge[:]}
}

// answer ends the slot's exchange with a RESPONSE (and a grant if one is
// idle).
func (q *qconn) answer(s *slot, st blockproto.Status, value uint64, detail string) {
	f := blockproto.ResponseFields{Op: blockproto.OpResponse, Tag: blockproto.Command(s.cmd[:]).Tag(), Status: st,
		Value: value, Detail: detail}
	n := q.attachGrant(s, &f.Grant)
	m, err := blockproto.EncodeResponse(q.txArea(s.idx), &f)
	if err != nil { // cannot happen: the area is MaxMessage bytes
		q.log.Error("encoding a response", "err", err)
		return
	}
	q.sendWR(s, n, len(m))
	s.mu.Lock()
	s.state = slotFree
	s.mu.Unlock()
	q.post(s, n+1)
}

// ready registers buf[head:head+n] under the slot's STag with a fresh key
// and access acc, and sends READY naming it; the slot then waits in next
// (slotAwaitRelease or slotAwaitWrite) under a lease.
func (q *qconn) ready(s *slot, buf []byte, head, n int, acc rnic.Access, next slotState) {
	f := blockproto.ReadyFields{Tag: blockproto.Command(s.cmd[:]).Tag()}
	k := q.attachGrant(s, &f.Grant)
	st := s.stag.WithKey(freshKey(q.t.dev, s.stag))
	s.pages[0] = buf[head : head+n]
	s.fr = rnic.FastReg{STag: st, Mem: rnic.Memory{Pages: s.pages[:], Len: uint64(n)}, ZeroBased: true, Access: acc}
	s.wrs[k] = rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &s.fr}
	f.Buffer = blockproto.GrantFields{STag: uint32(st), Len: uint32(n)}
	m := blockproto.EncodeReady(q.txArea(s.idx), &f)
	q.sendWR(s, k+1, len(m))
	s.mu.Lock()
	s.buf, s.head, s.stag, s.state = buf, head, st, next
	s.armLeaseLocked()
	s.mu.Unlock()
	q.post(s, k+2)
}

// sendData ends the slot's exchange with a DATA carrying the n bytes
// already in its DATA area (and a grant if one is idle).
func (q *qconn) sendData(s *slot, area []byte, n uint32) {
	f := blockproto.DataFields{Tag: blockproto.Command(s.cmd[:]).Tag(), Len: n}
	k := q.attachGrant(s, &f.Grant)
	m, err := blockproto.EncodeData(area, &f)
	if err != nil { // cannot happen: n <= the QP's inline size
		q.log.Error("encoding a DATA", "err", err)
		return
	}
	s.sge[0] = q.dataSGE(s.idx, len(m))
	s.wrs[k] = rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: s.sge[:]}
	s.mu.Lock()
	s.state = slotFree
	s.mu.Unlock()
	q.post(s, k+1)
}
