package rnic

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"
)

// side is one end of a test connection: a device, a PD, CQs, a QP, and the
// asynchronous events it saw.
type side struct {
	t    testing.TB
	dev  *Device
	pd   *PD
	scq  *CQ
	rcq  *CQ
	qp   *QP
	info *ConnInfo

	evMu   sync.Mutex
	events []AsyncEvent
	evCh   chan AsyncEvent
}

type pairOpts struct {
	rev         int
	noCRC       bool // both sides
	qp          QPConfig
	large       bool
	srq         bool
	cfg         Config
	acceptNoCRC bool
	// connect and accept, when set, adjust the parameters each side
	// passes to the connection manager.
	connect func(*ConnParams)
	accept  func(*AcceptParams)
	// proxy, when set, puts a TCP relay between the two devices (see
	// newProxy) so that a test can reset the connection under both QPs.
	proxy **proxy
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newSide(t testing.TB, name string, o pairOpts) *side {
	t.Helper()
	s := &side{t: t, evCh: make(chan AsyncEvent, 64)}
	cfg := o.cfg
	cfg.Name = name
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	cfg.CloseTimeout = 2 * time.Second
	cfg.AsyncHandler = func(ev AsyncEvent) {
		s.evMu.Lock()
		s.events = append(s.events, ev)
		s.evMu.Unlock()
		select {
		case s.evCh <- ev:
		default:
		}
	}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	s.dev = d
	if s.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.scq, err = d.CreateCQ(1024, 0); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = d.CreateCQ(1024, 0); err != nil {
		t.Fatal(err)
	}
	qc := o.qp
	qc.SendCQ, qc.RecvCQ = s.scq, s.rcq
	if qc.IRD == 0 {
		qc.IRD = 8
	}
	switch {
	case qc.ORD == 0:
		qc.ORD = 8
	case qc.ORD < 0: // a QP with ORD 0
		qc.ORD = 0
	}
	if !o.qp.InboundRead && !o.qp.InboundWrite && !o.qp.InboundAtomic && !o.qp.BindMW && !o.qp.Privileged {
		qc.InboundRead, qc.InboundWrite, qc.InboundAtomic, qc.BindMW, qc.Privileged = true, true, true, true, true
	}
	if o.srq {
		srq, err := d.CreateSRQ(s.pd, 256, 4, 0)
		if err != nil {
			t.Fatal(err)
		}
		qc.SRQ = srq
	}
	if s.qp, err = s.pd.CreateQP(qc); err != nil {
		t.Fatal(err)
	}
	return s
}

// newPair connects an Initiator "a" to a Responder "b" over loopback TCP.
// prepare runs on each side before the connection exists (post receives).
func newPair(t testing.TB, o pairOpts, prepare func(a, b *side)) (a, b *side) {
	t.Helper()
	a = newSide(t, "a", o)
	b = newSide(t, "b", o)
	if prepare != nil {
		prepare(a, b)
	}
	l, err := b.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		info *ConnInfo
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			ch <- res{err: err}
			return
		}
		ap := AcceptParams{PrivateData: []byte("resp"), NoCRC: o.noCRC || o.acceptNoCRC, LargeFPDU: o.large}
		if o.accept != nil {
			o.accept(&ap)
		}
		info, err := req.Accept(ctx, b.qp, ap)
		ch <- res{info, err}
	}()
	cp := ConnParams{PrivateData: []byte("init"), Rev: o.rev, NoCRC: o.noCRC, LargeFPDU: o.large}
	if o.connect != nil {
		o.connect(&cp)
	}
	addr := l.Addr().String()
	if o.proxy != nil {
		*o.proxy = newProxy(t, addr)
		addr = (*o.proxy).addr
	}
	a.info, err = a.dev.Connect(ctx, a.qp, addr, cp)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	b.info = r.info
	return a, b
}

// reg registers a fresh n-byte buffer with the given rights.
func (s *side) reg(n int, acc Access) (*MR, []byte) {
	s.t.Helper()
	buf := make([]byte, n)
	mr, err := s.pd.RegisterBytes(buf, acc)
	if err != nil {
		s.t.Fatal(err)
	}
	return mr, buf
}

// wait polls one completion from cq (failing the test after 10 s).
func (s *side) wait(cq *CQ) WC {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		s.t.Fatalf("%s: waiting for a completion: %v", s.dev.Name(), err)
	}
	return wc[0]
}

// waitOK polls one completion and requires success and the given op.
func (s *side) waitOK(cq *CQ, op WROp) WC {
	s.t.Helper()
	wc := s.wait(cq)
	if wc.Status != StatusSuccess || wc.Op != op {
		s.t.Fatalf("%s: completion %+v, want %s success", s.dev.Name(), wc, op)
	}
	return wc
}

// waitEvent waits for an asynchronous event of type typ.
func (s *side) waitEvent(typ EventType) AsyncEvent {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.evMu.Lock()
		for _, ev := range s.events {
			if ev.Type == typ {
				s.evMu.Unlock()
				return ev
			}
		}
		s.evMu.Unlock()
		select {
		case <-s.evCh:
		case <-deadline:
			s.t.Fatalf("%s: no %s event (saw %v)", s.dev.Name(), typ, s.eventTypes())
		}
	}
}

func (s *side) eventTypes() []EventType {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	var ts []EventType
	for _, ev := range s.events {
		ts = append(ts, ev.Type)
	}
	return ts
}

func (s *side) waitState(st QPState) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.qp.WaitState(ctx, st); err != nil {
		s.t.Fatalf("%s: %v", s.dev.Name(), err)
	}
}

func (s *side) postRecv(id uint64, mr *MR, n uint32) {
	s.t.Helper()
	if _, err := s.qp.PostRecv(RecvWR{ID: id, SGL: []SGE{{STag: mr.STag(), TO: 0, Len: n}}}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *side) post(wr SendWR) {
	s.t.Helper()
	if _, err := s.qp.PostSend(wr); err != nil {
		s.t.Fatal(err)
	}
}

// drainCQ returns every completion queued right now.
func drainCQ(cq *CQ) []WC {
	var out []WC
	var buf [64]WC
	for {
		n := cq.Poll(buf[:])
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

// proxy is a TCP relay between two devices: it accepts one connection (from
// the Initiator) and copies bytes both ways to target (the Responder). An
// end that closes is closed towards the other end the same way: a FIN as a
// FIN, a reset as a reset. reset closes both of its connections abortively
// (TCP RST), which each QP sees as an LLP reset. hold stops the Responder's
// bytes towards the Initiator after a given amount.
type proxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
	// budget is how many more bytes the relay copies towards the
	// Initiator (-1: no limit); when it reaches 0 the relay closes held
	// and waits for release or the end of the connection.
	budget  int64
	held    chan struct{}
	release chan struct{}
	done    chan struct{}
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), budget: -1, done: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); p.reset() })
	go func() {
		c1, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		c2, err := net.Dial("tcp", target)
		if err != nil {
			c1.Close()
			return
		}
		// A fixed, small receive buffer towards the Initiator (no
		// autotuning) bounds what the Responder has in flight while the
		// relay holds.
		c2.(*net.TCPConn).SetReadBuffer(64 << 10)
		p.mu.Lock()
		p.conns = append(p.conns, c1, c2)
		p.mu.Unlock()
		go p.relay(c2, c1, false)
		go p.relay(c1, c2, true)
	}()
	return p
}

// relay copies src to dst; toInitiator: under the hold budget.
func (p *proxy) relay(dst, src net.Conn, toInitiator bool) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		// The hold applies to what is written, so that one set while
		// the relay waits in a read still stops the bytes that read
		// returns at the budget.
		for off := 0; off < k; {
			m := k - off
			if toInitiator {
				if m = p.take(m); m == 0 {
					return
				}
			}
			if _, werr := dst.Write(buf[off : off+m]); werr != nil {
				resetConn(src)
				return
			}
			off += m
		}
		switch {
		case err == io.EOF:
			dst.(*net.TCPConn).CloseWrite()
			return
		case err != nil:
			resetConn(dst)
			return
		}
	}
}

// take returns how many of n bytes the relay towards the Initiator
// may write now, waiting while it is held; 0 when the proxy is reset.
func (p *proxy) take(n int) int {
	for {
		p.mu.Lock()
		if p.budget < 0 {
			p.mu.Unlock()
			return n
		}
		if p.budget > 0 {
			n = int(min(int64(n), p.budget))
			p.budget -= int64(n)
			p.mu.Unlock()
			return n
		}
		held, release := p.held, p.release
		select {
		case <-held:
		default:
			close(held)
		}
		p.mu.Unlock()
		select {
		case <-release:
		case <-p.done:
			return 0
		}
	}
}

// hold lets n more bytes through towards the Initiator and then stops that
// direction until release. The channel it returns is closed when the relay
// has stopped there.
func (p *proxy) hold(n int64) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.budget = n
	p.held, p.release = make(chan struct{}), make(chan struct{})
	return p.held
}

// unhold lifts the hold.
func (p *proxy) unhold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.budget = -1
	close(p.release)
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	for _, c := range p.conns {
		resetConn(c)
	}
	p.conns = nil
}

// stream returns s's connection (nil when the QP has none).
func (s *side) stream() *conn {
	s.qp.mu.Lock()
	defer s.qp.mu.Unlock()
	return s.qp.conn
}

// settle waits until stream c (if not nil) has ended, its receive and
// transmit goroutines returned, and every asynchronous event of s's device
// raised until then has been delivered (the dispatcher runs them in
// order). After it, an event that has not come will not come: tests that
// assert the absence of an event wait for this instead of sleeping.
func (s *side) settle(c *conn) {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	if c != nil {
		for _, ch := range []chan struct{}{c.rxDone, c.txDone} {
			select {
			case <-ch:
			case <-deadline:
				s.t.Fatalf("%s: the stream did not end", s.dev.Name())
			}
		}
	}
	done := make(chan struct{})
	s.dev.disp.post(func() { close(done) })
	select {
	case <-done:
	case <-deadline:
		s.t.Fatalf("%s: the event dispatcher is stuck", s.dev.Name())
	}
}

// roundTrip waits until the peer's receiver has handled every message s
// sent before: it posts a zero-length RDMA Read, which the peer answers
// only after them (a receiver handles its stream in order), and waits for
// its completion. The send completions before it are consumed and must be
// successful.
func (s *side) roundTrip() {
	s.t.Helper()
	s.post(SendWR{ID: 1<<64 - 1, Op: WRRead})
	for {
		wc := s.wait(s.scq)
		if wc.Status != StatusSuccess {
			s.t.Fatalf("%s: completion %+v", s.dev.Name(), wc)
		}
		if wc.Op == WRRead && wc.ID == 1<<64-1 {
			return
		}
	}
}
