package rnic

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// The connection manager: TCP connect/accept and the MPA start-up exchange
// (RFC 5044 §7.1, RFC 6581), then Attach. The verbs draft leaves this outside
// the verbs (§6.6); it plays the part of rdma_cm.
//
// Policy:
//   - We send revision 2 with the RFC 6581 IRD/ORD block by default (revision
//     1 on request) and accept both. CRC is on if either side asks; we ask
//     unless NoCRC is set. We never ask for markers and reject a Request that
//     asks us to send them.
//   - As Initiator we offer the zero-length Write and Read RTRs and send the
//     one the Responder picks; as Responder we pick Write, else Read, else
//     Send, and send nothing before it arrives.
//   - Large FPDUs (up to 64 KiB, whatever the TCP MSS) are used only between
//     two of our own peers that both enable them (largefpdu.go: an 8-byte
//     block at the front of the private data offers and confirms them);
//     any other peer gets MULPDU from the TCP MSS (RFC 5044 §8).

// ConnParams are the Initiator's choices.
type ConnParams struct {
	PrivateData []byte
	Rev         int  // 1 or 2 (default 2)
	NoCRC       bool // do not ask for CRC (it is still used if the peer asks)
	// IRD and ORD are advertised (RFC 6581) and applied to the QP when it
	// enters RTS; 0 means the QP's own. The ORD is then clamped to the
	// peer's IRD.
	IRD, ORD  int
	LargeFPDU bool
}

// AcceptParams are the Responder's choices.
type AcceptParams struct {
	PrivateData []byte
	NoCRC       bool
	// IRD and ORD: as in ConnParams (advertised and applied; the ORD is
	// clamped to the Initiator's IRD).
	IRD, ORD  int
	LargeFPDU bool
	// RTR is the RFC 6581 RTR type picked when the Initiator offers it
	// (RTRWrite, RTRRead or RTRSend); otherwise, or when zero, Write is
	// preferred, then Read, then Send.
	RTR RTRType
}

// ConnInfo describes an established connection.
type ConnInfo struct {
	PrivateData      []byte // the peer's ULP private data
	Rev              int
	CRC              bool
	RTR              RTRType
	PeerIRD, PeerORD int
	MULPDU           int
	LargeFPDU        bool
}

// RejectError is returned to an Initiator whose Request was rejected.
type RejectError struct {
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rnic: connection rejected by peer (%d bytes of private data)", len(e.PrivateData))
}

func (e *RejectError) Unwrap() error { return ErrRejected }

// standardMULPDU computes RFC 5044's MULPDU from the connection's TCP MSS
// (no markers, mpa.MULPDU: EMSS - (6 + EMSS mod 4)), within
// minMULPDU..maxULPDU.
func standardMULPDU(nc net.Conn) int {
	emss := 1460
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if v, err := syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG); err == nil && v > 0 {
					emss = v
				}
			})
		}
	}
	return min(max(mpa.MULPDU(emss, false), minMULPDU), maxULPDU)
}

func (d *Device) deadline(ctx context.Context) time.Time {
	dl := time.Now().Add(d.cfg.MPATimeout)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	return dl
}

func tuneTCP(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlive(true)
		tc.SetKeepAlivePeriod(15 * time.Second)
	}
}

// Connect connects qp to a listening peer at addr ("host:port"), performs
// the MPA Initiator exchange and moves qp to RTS.
func (d *Device) Connect(ctx context.Context, qp *QP, addr string, p ConnParams) (*ConnInfo, error) {
	var dl net.Dialer
	nc, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rnic: connect %s: %w", addr, err)
	}
	info, err := d.ConnectConn(ctx, qp, nc, p)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("rnic: connect %s: %w", addr, err)
	}
	return info, nil
}

// ConnectConn runs the MPA Initiator exchange on an established connection
// and attaches qp to it.
func (d *Device) ConnectConn(ctx context.Context, qp *QP, nc net.Conn, p ConnParams) (*ConnInfo, error) {
	if st := qp.State(); st != StateIdle {
		return nil, fmt.Errorf("%w (%s)", ErrQPNotIdle, st)
	}
	tuneTCP(nc)
	rev := p.Rev
	if rev == 0 {
		rev = 2
	}
	if rev != 1 && rev != 2 {
		return nil, fmt.Errorf("%w: MPA revision %d", ErrInvalidModifier, rev)
	}
	ird, ord, err := qp.connIRDORD(p.IRD, p.ORD)
	if err != nil {
		return nil, err
	}
	req := mpa.Frame{CRC: !p.NoCRC, Rev: uint8(rev), PrivateData: withExt(p.PrivateData, p.LargeFPDU)}
	if rev == 2 {
		req.Enhanced = &mpa.IRDORD{IRD: uint16(ird), ORD: uint16(ord), P2P: true, RTRWrite: true, RTRRead: true}
	}
	b, err := req.Append(nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMPA, err)
	}
	nc.SetDeadline(d.deadline(ctx))
	stopCtx := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stopCtx()
	if _, err := nc.Write(b); err != nil {
		return nil, fmt.Errorf("%w: sending MPA Request: %w", ErrMPA, err)
	}
	rep, err := mpa.ReadFrame(nc, true)
	if err != nil {
		return nil, fmt.Errorf("%w: reading MPA Reply: %w", ErrMPA, err)
	}
	nc.SetDeadline(time.Time{})
	if rep.Reject {
		return nil, &RejectError{PrivateData: rep.PrivateData}
	}
	// A Responder confirms large FPDUs only to a Request that offered them:
	// otherwise the Reply's private data is all the peer's own.
	peerMax, ulpPD := 0, rep.PrivateData
	if p.LargeFPDU {
		peerMax, ulpPD, _ = splitExt(rep.PrivateData)
	}
	crc := req.CRC || rep.CRC
	refuse := func(code term.Code, why string) error {
		sendMPATerminate(nc, crc, code)
		return fmt.Errorf("%w: %s", ErrMPA, why)
	}
	if rep.Markers {
		return nil, refuse(term.MPAInvalidFrame, "the Responder requires markers, which this RNIC does not send")
	}
	if int(rep.Rev) > rev {
		return nil, refuse(term.MPAInvalidFrame, fmt.Sprintf("MPA Reply revision %d to a revision %d Request", rep.Rev, rev))
	}
	s := Stream{Conn: nc, Initiator: true, Rev: int(rep.Rev), CRC: crc, PrivateData: ulpPD, IRD: ird, ORD: ord}
	if rep.Rev == 2 && rep.Enhanced != nil {
		e := rep.Enhanced
		s.Enhanced = true
		s.PeerIRD, s.PeerORD = int(e.IRD), int(e.ORD)
		if int(e.ORD) > ird {
			return nil, refuse(term.MPAInsufficientIRD, fmt.Sprintf("peer ORD %d exceeds our IRD %d", e.ORD, ird))
		}
		if e.P2P {
			switch {
			case e.RTRWrite && !e.RTRRead && !e.RTRSend:
				s.RTR = RTRWrite
			case e.RTRRead && !e.RTRWrite && !e.RTRSend:
				s.RTR = RTRRead
			default:
				return nil, refuse(term.MPANoMatchingRTR, "the Responder chose no single RTR type we offered")
			}
		}
	}
	large := p.LargeFPDU && peerMax > 0
	if large {
		s.MULPDU = min(peerMax, maxULPDU)
	} else {
		s.MULPDU = standardMULPDU(nc)
	}
	if err := qp.Attach(s); err != nil {
		return nil, err
	}
	return &ConnInfo{PrivateData: ulpPD, Rev: s.Rev, CRC: crc, RTR: s.RTR, PeerIRD: s.PeerIRD, PeerORD: s.PeerORD,
		MULPDU: s.MULPDU, LargeFPDU: large}, nil
}

// connIRDORD resolves the IRD and ORD a connection advertises: the given
// values, or the QP's where zero. They are checked against the RNIC's
// limits here, before anything is sent, and applied to the QP by Attach
// (Stream.IRD/ORD), so what the peer is told is what the QP enforces.
func (qp *QP) connIRDORD(ird, ord int) (int, int, error) {
	c := qp.dev.cfg
	if ird < 0 || ird > c.MaxIRD {
		return 0, 0, fmt.Errorf("rnic: %w: IRD %d", ErrIRDExceedsCapability, ird)
	}
	if ord < 0 || ord > c.MaxORD {
		return 0, 0, fmt.Errorf("rnic: %w: ORD %d", ErrORDExceedsCapability, ord)
	}
	qi := qp.Query()
	if ird == 0 {
		ird = qi.IRD
	}
	if ord == 0 {
		ord = qi.ORD
	}
	return ird, ord, nil
}

// sendMPATerminate sends a Terminate with an LLP/MPA cause as the first FPDU
// of a stream that will not enter RDMA mode, then closes it.
func sendMPATerminate(nc net.Conn, crc bool, code term.Code) {
	var h [ddp.UntaggedHeaderLen]byte
	ddp.Untagged(h[:]).Encode(&ddp.UntaggedFields{Last: true, RsvdULP0: rdmap.Ctrl(rdmap.OpTerminate),
		QN: rdmap.QNTerminate, MSN: 1})
	body := rdmap.AppendTerminate(nil, &rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: code}})
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	nc.Write(mpa.AppendFPDU(nil, h[:], body, crc))
	closeWrite(nc)
	nc.Close()
}

// Listener accepts connection requests.
type Listener struct {
	dev  *Device
	ln   net.Listener
	reqs chan *ConnRequest
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// Listen listens for MPA Initiators on addr ("host:port").
func (d *Device) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rnic: listen %s: %w", addr, err)
	}
	return d.ListenOn(ln), nil
}

// ListenOn accepts connection requests on an existing listener.
func (d *Device) ListenOn(ln net.Listener) *Listener {
	l := &Listener{dev: d, ln: ln, reqs: make(chan *ConnRequest), done: make(chan struct{})}
	d.mu.Lock()
	d.lsns[l] = struct{}{}
	d.mu.Unlock()
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening; pending requests are dropped.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.dev.mu.Lock()
		delete(l.dev.lsns, l)
		l.dev.mu.Unlock()
	})
	l.wg.Wait()
	return err
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.dev.log.Warn("accept failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.wg.Add(1)
		go l.handshake(nc)
	}
}

// handshake reads and checks a Request, then hands it to Accept.
func (l *Listener) handshake(nc net.Conn) {
	defer l.wg.Done()
	d := l.dev
	tuneTCP(nc)
	nc.SetDeadline(time.Now().Add(d.cfg.MPATimeout))
	// The Request is read through a buffer: whatever arrived with it lands
	// there too, and anything past the Request is data the Initiator sent
	// before our Reply. Those bytes are not handed on: such a connection is
	// refused (Accept).
	br := bufio.NewReaderSize(nc, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	req, err := mpa.ReadFrame(br, false)
	if err != nil {
		if errors.Is(err, io.EOF) {
			// Closed before its first byte (io.ErrUnexpectedEOF past it):
			// a port probe, not a bad Request.
			d.log.Debug("connection closed before an MPA Request", "peer", nc.RemoteAddr())
		} else {
			d.log.Info("bad MPA Request: closing", "peer", nc.RemoteAddr(), "err", err)
		}
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	peerMax, ulpPD, _ := splitExt(req.PrivateData) // a block there is the Initiator's offer
	cr := &ConnRequest{l: l, nc: nc, Rev: int(req.Rev), CRC: req.CRC, Markers: req.Markers, PrivateData: ulpPD,
		RemoteAddr: nc.RemoteAddr(), peerMax: peerMax, early: br.Buffered() > 0}
	if req.Rev == 2 && req.Enhanced != nil {
		e := req.Enhanced
		cr.Enhanced, cr.PeerIRD, cr.PeerORD = true, int(e.IRD), int(e.ORD)
		cr.p2p, cr.offer = e.P2P, *e
	}
	if req.Markers {
		d.log.Info("MPA Request asks for markers: rejecting", "peer", nc.RemoteAddr())
		cr.Reject(nil)
		return
	}
	select {
	case l.reqs <- cr:
	case <-l.done:
		nc.Close()
	}
}

// Accept returns the next connection request.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, fmt.Errorf("rnic: accept: %w", net.ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("rnic: accept: %w", ctx.Err())
	}
}

// ConnRequest is a received MPA Request waiting for Accept or Reject.
type ConnRequest struct {
	l                *Listener
	nc               net.Conn
	Rev              int
	CRC              bool // the Initiator asked for CRC
	Markers          bool
	Enhanced         bool // RFC 6581 IRD/ORD block present
	PeerIRD, PeerORD int
	PrivateData      []byte
	RemoteAddr       net.Addr
	peerMax          int
	p2p              bool
	offer            mpa.IRDORD
	early            bool // bytes followed the Request before we answered it
	mu               sync.Mutex
	answered         bool
}

func (r *ConnRequest) answer() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return false
	}
	r.answered = true
	return true
}

// Reject answers with an MPA Reply with the Reject flag and closes.
func (r *ConnRequest) Reject(privateData []byte) error {
	if !r.answer() {
		return ErrNotAccepted
	}
	defer r.nc.Close()
	rep := mpa.Frame{Reply: true, Reject: true, Rev: uint8(max(min(r.Rev, 2), 1)), CRC: r.CRC, PrivateData: privateData}
	if rep.Rev == 2 && r.Enhanced {
		rep.Enhanced = &mpa.IRDORD{}
	}
	b, err := rep.Append(nil)
	if err != nil {
		return fmt.Errorf("rnic: reject: %w", err)
	}
	r.nc.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := r.nc.Write(b); err != nil {
		return fmt.Errorf("rnic: reject: %w", err)
	}
	closeWrite(r.nc)
	return nil
}

// earlyData reports bytes the Initiator sent before our Reply, a protocol
// violation (RFC 5044 §7.1: the Initiator sends no FPDU before it has the
// Reply). On the Responder that means bytes received between the Request
// and the moment the Reply is sent: those that came with the Request (read
// into the handshake's buffer, r.early) and those waiting in the socket's
// receive queue now, which are peeked at (MSG_PEEK | MSG_DONTWAIT: not
// consumed, no waiting). Bytes still in flight when the Reply leaves cannot
// be told from bytes sent after it, on any Responder; they are read as the
// first FPDU. A connection that is not a socket (ListenOn with another
// kind of listener) gets the buffer check only.
func (r *ConnRequest) earlyData() bool {
	if r.early {
		return true
	}
	sc, ok := r.nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}

// Accept answers with an MPA Reply and moves qp to RTS.
func (r *ConnRequest) Accept(ctx context.Context, qp *QP, p AcceptParams) (*ConnInfo, error) {
	if !r.answer() {
		return nil, ErrNotAccepted
	}
	nc := r.nc
	fail := func(err error) (*ConnInfo, error) {
		nc.Close()
		return nil, fmt.Errorf("rnic: accept from %s: %w", r.RemoteAddr, err)
	}
	if st := qp.State(); st != StateIdle {
		return fail(fmt.Errorf("%w (%s)", ErrQPNotIdle, st))
	}
	if r.earlyData() {
		return fail(fmt.Errorf("%w: the Initiator sent data before the MPA Reply", ErrMPA))
	}
	ird, ord, err := qp.connIRDORD(p.IRD, p.ORD)
	if err != nil {
		return fail(err)
	}
	rev := min(r.Rev, 2)
	crc := r.CRC || !p.NoCRC
	large := p.LargeFPDU && r.peerMax > 0
	// The Reply's C bit says whether the connection uses CRCs: set when
	// either side asked (RFC 5044 §7.1), so an Initiator that asked sees its
	// request honoured (Linux siw built with mpa_crc_required refuses a
	// Reply without it).
	rep := mpa.Frame{Reply: true, CRC: crc, Rev: uint8(rev), PrivateData: withExt(p.PrivateData, large)}
	s := Stream{Conn: nc, Rev: rev, CRC: crc, PrivateData: r.PrivateData, PeerIRD: r.PeerIRD, PeerORD: r.PeerORD,
		IRD: ird, ORD: ord}
	if rev == 2 && r.Enhanced {
		// Never let the peer read more than it can take: our ORD is clamped
		// to its IRD; our IRD is what we can serve (the peer lowers its ORD).
		ord = min(ord, r.PeerIRD)
		e := &mpa.IRDORD{IRD: uint16(ird), ORD: uint16(ord)}
		if r.p2p {
			e.P2P = true
			switch {
			case p.RTR == RTRRead && r.offer.RTRRead:
				e.RTRRead, s.RTR = true, RTRRead
			case p.RTR == RTRSend && r.offer.RTRSend:
				e.RTRSend, s.RTR = true, RTRSend
			case r.offer.RTRWrite:
				e.RTRWrite, s.RTR = true, RTRWrite
			case r.offer.RTRRead:
				e.RTRRead, s.RTR = true, RTRRead
			case r.offer.RTRSend:
				e.RTRSend, s.RTR = true, RTRSend
			}
		}
		rep.Enhanced = e
		s.Enhanced = true
	}
	b, err := rep.Append(nil)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrMPA, err))
	}
	if large {
		s.MULPDU = min(r.peerMax, maxULPDU)
	} else {
		s.MULPDU = standardMULPDU(nc)
	}
	// Attach before the Reply goes out, so no FPDU the Initiator sends right
	// after it is missed: the receiver is reading when the Reply leaves.
	if err := qp.Attach(s); err != nil {
		return fail(err)
	}
	nc.SetWriteDeadline(r.l.dev.deadline(ctx))
	if _, err := nc.Write(b); err != nil {
		nc.SetWriteDeadline(time.Time{})
		qp.Modify(StateError, ModifyAttrs{})
		return nil, fmt.Errorf("rnic: accept from %s: sending MPA Reply: %w", r.RemoteAddr, err)
	}
	nc.SetWriteDeadline(time.Time{})
	return &ConnInfo{PrivateData: r.PrivateData, Rev: rev, CRC: crc, RTR: s.RTR, PeerIRD: r.PeerIRD,
		PeerORD: r.PeerORD, MULPDU: s.MULPDU, LargeFPDU: large}, nil
}
