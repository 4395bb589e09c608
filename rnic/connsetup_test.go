package rnic

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// Connection set-up between two engines: CRC asked for by one side only, a
// rejected connection, the Read RTR, and large FPDUs asked for by one side
// only.

// exchange moves data both ways on a connected pair (a Send each way and a
// Read from a), proving the stream works with what was negotiated.
func exchange(t *testing.T, a, b *side) {
	t.Helper()
	const n = 150 << 10
	ar, _ := a.reg(n, LocalWrite)
	br, brBuf := b.reg(n, LocalWrite)
	a.postRecv(900, ar, n)
	b.postRecv(900, br, n)
	msg, msgBuf := a.reg(n, LocalRead|RemoteRead)
	fill(msgBuf, 31)
	a.post(SendWR{ID: 900, Op: WRSend, SGL: []SGE{{STag: msg.STag(), Len: n}}})
	a.waitOK(a.scq, WRSend)
	if wc := b.waitOK(b.rcq, WRRecv); wc.Bytes != n || !bytes.Equal(brBuf, msgBuf) {
		t.Fatalf("send a->b: %+v", wc)
	}
	b.post(SendWR{ID: 901, Op: WRSend})
	b.waitOK(b.scq, WRSend)
	a.waitOK(a.rcq, WRRecv)
	sink, sinkBuf := b.reg(n, LocalWrite|RemoteWrite)
	b.post(SendWR{ID: 902, Op: WRRead, Local: SGE{STag: sink.STag(), Len: n}, Remote: RemoteAddr{STag: msg.STag()}})
	b.waitOK(b.scq, WRRead)
	if !bytes.Equal(sinkBuf, msgBuf) {
		t.Fatal("read b<-a differs")
	}
}

// TestCRCOneSide: CRC is used when either side asks for it (RFC 5044 §7.1),
// whichever side that is.
func TestCRCOneSide(t *testing.T) {
	for _, v := range []struct {
		name string
		o    pairOpts
	}{
		{"initiator-asks", pairOpts{acceptNoCRC: true}},
		{"responder-asks", pairOpts{connect: func(p *ConnParams) { p.NoCRC = true }}},
		{"initiator-asks-rev1", pairOpts{rev: 1, acceptNoCRC: true}},
		{"responder-asks-rev1", pairOpts{rev: 1, connect: func(p *ConnParams) { p.NoCRC = true }}},
	} {
		t.Run(v.name, func(t *testing.T) {
			a, b := newPair(t, v.o, nil)
			if !a.info.CRC || !b.info.CRC {
				t.Fatalf("CRC %v/%v, want on at both ends", a.info.CRC, b.info.CRC)
			}
			for _, s := range []*side{a, b} {
				if si := s.qp.Query().Stream; si == nil || !si.CRC {
					t.Fatalf("%s: stream %+v", s.dev.Name(), si)
				}
			}
			exchange(t, a, b)
		})
	}
}

// TestRejectedConnection: the Responder rejects; the Initiator's Connect
// fails with ErrRejected carrying the Responder's private data (whole, even
// when it looks like the large-FPDU block the Initiator offered: a Reject
// never confirms it), neither QP leaves Idle and no event is raised. The
// same QP then connects normally.
func TestRejectedConnection(t *testing.T) {
	for _, rev := range []int{1, 2} {
		t.Run([]string{"", "rev1", "rev2"}[rev], func(t *testing.T) {
			a := newSide(t, "a", pairOpts{})
			b := newSide(t, "b", pairOpts{})
			l, err := b.dev.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			busy := append(withExt(nil, true), "busy"...)
			done := make(chan error, 1)
			go func() {
				req, err := l.Accept(ctx)
				if err != nil {
					done <- err
					return
				}
				if string(req.PrivateData) != "hello" || req.Rev != rev {
					done <- errors.New("unexpected request")
					return
				}
				done <- req.Reject(busy)
			}()
			_, err = a.dev.Connect(ctx, a.qp, l.Addr().String(), ConnParams{Rev: rev, PrivateData: []byte("hello"), LargeFPDU: true})
			if !errors.Is(err, ErrRejected) {
				t.Fatalf("connect: %v, want ErrRejected", err)
			}
			var re *RejectError
			if !errors.As(err, &re) || !bytes.Equal(re.PrivateData, busy) {
				t.Fatalf("reject error %#v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("responder: %v", err)
			}
			for _, s := range []*side{a, b} {
				s.settle(nil) // no stream: the events raised so far are delivered
				if q := s.qp.Query(); q.State != StateIdle || q.Stream != nil {
					t.Fatalf("%s: QP in %s, stream %+v", s.dev.Name(), q.State, q.Stream)
				}
				if evs := s.eventTypes(); len(evs) != 0 {
					t.Fatalf("%s: events %v", s.dev.Name(), evs)
				}
			}
			// The Initiator's QP is still usable.
			go func() {
				req, err := l.Accept(ctx)
				if err != nil {
					done <- err
					return
				}
				_, err = req.Accept(ctx, b.qp, AcceptParams{})
				done <- err
			}()
			if a.info, err = a.dev.Connect(ctx, a.qp, l.Addr().String(), ConnParams{Rev: rev}); err != nil {
				t.Fatalf("second connect: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("accept: %v", err)
			}
			exchange(t, a, b)
		})
	}
}

// TestRTRRead: the Responder picks the zero-length RDMA Read as the RFC 6581
// RTR. The Initiator sends it first (it takes an ORD slot until its empty
// response arrives: with ORD 1 the first real Read waits for it) and the
// Responder answers it without a completion; then traffic flows both ways.
func TestRTRRead(t *testing.T) {
	o := pairOpts{qp: QPConfig{IRD: 1, ORD: 1, InboundRead: true, InboundWrite: true},
		accept: func(p *AcceptParams) { p.RTR = RTRRead }}
	var bSrc *MR
	var bSrcBuf []byte
	a, b := newPair(t, o, func(a, b *side) {
		bSrc, bSrcBuf = b.reg(64<<10, LocalRead|RemoteRead)
		fill(bSrcBuf, 33)
	})
	if a.info.RTR != RTRRead || b.info.RTR != RTRRead {
		t.Fatalf("RTR %s/%s, want read", a.info.RTR, b.info.RTR)
	}
	for _, s := range []*side{a, b} {
		if si := s.qp.Query().Stream; si == nil || si.RTR != RTRRead {
			t.Fatalf("%s: stream %+v", s.dev.Name(), si)
		}
	}
	// Posted at once: the Read waits for the RTR's response (ORD 1).
	sink, sinkBuf := a.reg(64<<10, LocalWrite|RemoteWrite)
	a.post(SendWR{ID: 1, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 64 << 10}, Remote: RemoteAddr{STag: bSrc.STag()}})
	if wc := a.waitOK(a.scq, WRRead); wc.ID != 1 {
		t.Fatalf("%+v", wc)
	}
	if !bytes.Equal(sinkBuf, bSrcBuf) {
		t.Fatal("read data differs")
	}
	exchange(t, a, b)
	if n := a.scq.Len() + b.scq.Len() + a.rcq.Len() + b.rcq.Len(); n != 0 {
		t.Fatalf("%d stray completions (the RTR must complete nothing)", n)
	}
}

// TestLargeFPDUOneSide: large FPDUs are used only when both ends ask; when
// one side alone asks, both use the standard MULPDU from the TCP MSS (RFC
// 5044 §8) and neither sees the extension block in the private data.
func TestLargeFPDUOneSide(t *testing.T) {
	for _, v := range []struct {
		name string
		o    pairOpts
	}{
		{"initiator-only", pairOpts{connect: func(p *ConnParams) { p.LargeFPDU = true }}},
		{"responder-only", pairOpts{accept: func(p *AcceptParams) { p.LargeFPDU = true }}},
		{"initiator-only-rev1", pairOpts{rev: 1, connect: func(p *ConnParams) { p.LargeFPDU = true }}},
	} {
		t.Run(v.name, func(t *testing.T) {
			a, b := newPair(t, v.o, nil)
			if a.info.LargeFPDU || b.info.LargeFPDU {
				t.Fatalf("large FPDUs %v/%v with one side asking", a.info.LargeFPDU, b.info.LargeFPDU)
			}
			if string(a.info.PrivateData) != "resp" || string(b.info.PrivateData) != "init" {
				t.Fatalf("private data %q/%q", a.info.PrivateData, b.info.PrivateData)
			}
			for _, s := range []*side{a, b} {
				s.qp.mu.Lock()
				std := standardMULPDU(s.qp.conn.nc)
				s.qp.mu.Unlock()
				si := s.qp.Query().Stream
				if si.MULPDU != std || si.MULPDU >= maxULPDU || s.info.MULPDU != std {
					t.Fatalf("%s: MULPDU %d (info %d), want the standard %d", s.dev.Name(), si.MULPDU, s.info.MULPDU, std)
				}
			}
			exchange(t, a, b)
		})
	}
}

// TestExplicitIRDApplied: an IRD given in AcceptParams or ConnParams is
// advertised in the MPA exchange and applied to the QP, so the peer,
// which clamps its ORD to it, can use it all: the QP does not keep its own
// IRD and terminate the peer's Reads past it.
func TestExplicitIRDApplied(t *testing.T) {
	const reads, size = 8, 1 << 20
	run := func(t *testing.T, o pairOpts, reqSide func(a, b *side) (req, src *side)) {
		o.qp = QPConfig{IRD: 1, ORD: 8, InboundRead: true, InboundWrite: true}
		a, b := newPair(t, o, nil)
		req, src := reqSide(a, b)
		if q := src.qp.Query(); q.IRD != 4 {
			t.Fatalf("data source IRD %d, want the advertised 4", q.IRD)
		}
		if q := req.qp.Query(); q.ORD != 4 {
			t.Fatalf("requester ORD %d, want the peer's IRD 4", q.ORD)
		}
		smr, sbuf := src.reg(size, LocalRead|RemoteRead)
		fill(sbuf, 5)
		dmr, dbuf := req.reg(reads*size, LocalWrite|RemoteWrite)
		for i := 0; i < reads; i++ {
			req.post(SendWR{ID: uint64(i), Op: WRRead, Local: SGE{STag: dmr.STag(), TO: uint64(i * size), Len: size},
				Remote: RemoteAddr{STag: smr.STag()}})
		}
		for i := 0; i < reads; i++ {
			req.waitOK(req.scq, WRRead)
			if !bytes.Equal(dbuf[i*size:(i+1)*size], sbuf) {
				t.Fatalf("read %d differs", i)
			}
		}
	}
	t.Run("accept", func(t *testing.T) {
		run(t, pairOpts{accept: func(p *AcceptParams) { p.IRD = 4 }}, func(a, b *side) (*side, *side) { return a, b })
	})
	t.Run("connect", func(t *testing.T) {
		run(t, pairOpts{connect: func(p *ConnParams) { p.IRD = 4 }}, func(a, b *side) (*side, *side) { return b, a })
	})
	t.Run("beyond-capability", func(t *testing.T) {
		s := newSide(t, "x", pairOpts{})
		c1, c2 := net.Pipe()
		c2.Close()
		defer c1.Close()
		_, err := s.dev.ConnectConn(t.Context(), s.qp, c1, ConnParams{IRD: s.dev.Query().MaxIRD + 1})
		if !errors.Is(err, ErrIRDExceedsCapability) {
			t.Fatalf("IRD beyond the RNIC's maximum: %v", err)
		}
		if s.qp.State() != StateIdle {
			t.Fatalf("QP in %s", s.qp.State())
		}
	})
}
