package rnic

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/internal/sockio"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// RTRType is the RFC 6581 ready-to-receive message type negotiated for a
// stream: the MPA Initiator sends it as its first FPDU and the Responder
// sends nothing before it arrives.
type RTRType uint8

const (
	RTRNone  RTRType = iota // MPA revision 1, or no RTR negotiated
	RTRWrite                // zero-length RDMA Write
	RTRRead                 // zero-length RDMA Read
	RTRSend                 // zero-length Send
)

func (r RTRType) String() string { return [...]string{"none", "write", "read", "send"}[r] }

// Stream is an established TCP connection in RDMA mode, with what MPA
// negotiated. The connection manager builds it; Attach moves a QP to RTS on
// it. After the MPA frames, only FPDUs may cross the connection.
type Stream struct {
	Conn net.Conn
	// Initiator: this side sent the MPA Request.
	Initiator bool
	Rev       int
	CRC       bool
	// RxMarkers: the peer inserts MPA markers in what it sends to us.
	RxMarkers bool
	// MULPDU is the largest ULPDU this side sends.
	MULPDU int
	// RTR: as Initiator, the RTR to send first; as Responder, the RTR to
	// expect (and absorb) first. RTRNone with a Responder still waits for
	// the Initiator's first FPDU before sending (RFC 5044 §7.1).
	RTR RTRType
	// Enhanced: the peer advertised PeerIRD and PeerORD (RFC 6581); the
	// QP's ORD is then clamped to PeerIRD.
	Enhanced         bool
	PeerIRD, PeerORD int
	// PrivateData is the peer's ULP private data.
	PrivateData []byte
	// IRD and ORD, when non-zero, become the QP's IRD and ORD (what this
	// side advertised in the MPA exchange) before the ORD is clamped.
	IRD, ORD int
}

// StreamInfo describes an attached stream.
type StreamInfo struct {
	Local, Remote    string
	Initiator        bool
	Rev              int
	CRC              bool
	RxMarkers        bool
	MULPDU           int
	RTR              RTRType
	PeerIRD, PeerORD int
}

type txMode int32

const (
	txRun       txMode = iota
	txGraceful         // send FIN and stop (Closing)
	txTerminate        // send the pending Terminate, FIN, stop
	txSilent           // a Terminate was received: send nothing more, FIN, stop
	txAbort            // stop now
)

// conn is a QP's attached stream: the engine state of one connection.
type conn struct {
	qp   *QP
	dev  *Device
	nc   net.Conn
	info StreamInfo
	log  *slog.Logger
	rd   *mpa.Reader

	doorbell chan struct{}
	// gate opens when the transmitter may send ULP messages: for a
	// Responder once the Initiator's first FPDU arrived, for an Initiator
	// once its RTR (RFC 6581), if any, is in the batch. Until then only
	// the transmit goroutine sends (inline senders kick it).
	gate     chan struct{}
	gateOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	txDone   chan struct{}
	rxDone   chan struct{}
	mode     atomic.Int32

	// failed is set once (under qp.mu), by the stream's first error: a
	// local one (fail), with termOut the Terminate to send, or the peer's
	// Terminate (rxState.terminateReceived), which gets none in reply.
	// The first is the QP's Terminate; the other is not acted on.
	failed  bool
	termOut *rdmap.TerminateFields
	aborted atomic.Bool
	abortEv atomic.Uint32 // event to raise when an abort ends the stream

	// The responder queue (IRRQ): Read Responses and Atomic Responses to
	// send, in request order.
	respMu  sync.Mutex
	resp    []respJob
	irdUsed int

	// txMu guards tx: the transmit goroutine holds it while sending, and
	// pushInline takes it when free.
	txMu sync.Mutex
	// combining is set while a poster yields in pushInline before sending
	// what is queued (its own work and that of posters arriving meanwhile).
	combining atomic.Bool
	raw       syscall.RawConn // nil when the connection offers none (no inline sends)
	// sr reads the socket for the receiver (see package sockio); nil when
	// the connection offers no syscall.RawConn.
	sr *sockio.Reader
	// placeWaits counts the receive's waits for the socket inside a
	// segment's payload (conn.waitReadable): segments that arrived in
	// pieces. The tests read it to know that a segment is half placed.
	placeWaits atomic.Uint64
	tx         txState
	rx         rxState
	drive      driveState
}

// Attach moves an Idle QP to RTS on an established stream (Modify QP
// Idle->RTS with an LLP stream handle, draft §6.2.1.2). Work requests posted
// in Idle start at once. The QP owns the connection from now on.
func (qp *QP) Attach(s Stream) error {
	if s.Conn == nil {
		return fmt.Errorf("rnic: attach QP %d: %w: no connection", qp.id, ErrInvalidStream)
	}
	qp.mu.Lock()
	if qp.destroyed {
		qp.mu.Unlock()
		return fmt.Errorf("rnic: attach: %w", ErrInvalidQP)
	}
	if qp.state != StateIdle || qp.conn != nil {
		st := qp.state
		qp.mu.Unlock()
		return fmt.Errorf("rnic: attach QP %d in %s: %w", qp.id, st, ErrInvalidStateChange)
	}
	if s.IRD < 0 || s.IRD > qp.dev.cfg.MaxIRD || s.ORD < 0 || s.ORD > qp.dev.cfg.MaxORD {
		qp.mu.Unlock()
		return fmt.Errorf("rnic: attach QP %d: %w: IRD %d ORD %d", qp.id, ErrInvalidModifier, s.IRD, s.ORD)
	}
	if s.IRD > 0 {
		qp.ird = s.IRD
	}
	if s.ORD > 0 {
		qp.ord = s.ORD
		qp.ordA.Store(int32(qp.ord))
	}
	if s.Enhanced && qp.ord > s.PeerIRD {
		qp.ord = s.PeerIRD // never exceed what the peer can take
		qp.ordA.Store(int32(qp.ord))
	}
	c := newConn(qp, s)
	qp.conn = c
	qp.term, qp.termSent = nil, false
	qp.setStateLocked(StateRTS)
	qp.mu.Unlock()
	if cfg := &qp.cfg; cfg.SendCQ == cfg.RecvCQ {
		cfg.SendCQ.attach(c, 2)
	} else {
		cfg.SendCQ.attach(c, 1)
		cfg.RecvCQ.attach(c, 1)
	}
	go c.rxMain()
	go c.txMain()
	return nil
}

func newConn(qp *QP, s Stream) *conn {
	mulpdu := s.MULPDU
	if mulpdu <= 0 || mulpdu > maxULPDU {
		mulpdu = maxULPDU
	}
	if mulpdu < minMULPDU {
		mulpdu = minMULPDU
	}
	c := &conn{
		qp: qp, dev: qp.dev, nc: s.Conn,
		info: StreamInfo{Local: addrString(s.Conn.LocalAddr()), Remote: addrString(s.Conn.RemoteAddr()),
			Initiator: s.Initiator, Rev: s.Rev, CRC: s.CRC, RxMarkers: s.RxMarkers, MULPDU: mulpdu, RTR: s.RTR,
			PeerIRD: s.PeerIRD, PeerORD: s.PeerORD},
		doorbell: make(chan struct{}, 1),
		gate:     make(chan struct{}),
		stop:     make(chan struct{}),
		txDone:   make(chan struct{}),
		rxDone:   make(chan struct{}),
		drive:    driveState{handback: make(chan struct{}, 1)},
		resp:     make([]respJob, 0, max(qp.ird, 1)+1), // +1: the one being sent once its IRD place is freed
	}
	c.log = qp.dev.log.With("qp", qp.id, "peer", c.info.Remote)
	if sc, ok := s.Conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw = raw
		}
	}
	c.sr = sockio.NewReader(s.Conn)
	c.rd = mpa.NewReader(rxSource{c}, mpa.ReaderConfig{CRC: s.CRC, Markers: s.RxMarkers, MaxULPDU: maxULPDU, BufSize: rxBufSize})
	if s.Initiator && s.RTR == RTRNone {
		c.openGate()
	}
	c.tx.init(c)
	c.rx.init(c)
	return c
}

const (
	maxULPDU  = 65535 - 8 // leave room for pad so a whole FPDU fits the 16-bit length rules
	minMULPDU = 128
	rxBufSize = 256 << 10
)

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// rxSource is what the receiver reads the stream from: the connection,
// with the end of a batch marked before each read (rxState.batchEnd).
type rxSource struct{ c *conn }

func (s rxSource) Read(p []byte) (int, error) {
	c := s.c
	c.rx.batchEnd()
	switch {
	case c.sr == nil:
		return c.nc.Read(p)
	case c.rd.Idle():
		return c.readIdle(p) // the receive may pause here (drive.go)
	}
	return c.read(p, nil, false)
}

// ReadVec reads into a, then b, in one system call where the connection
// allows it (mpa.VecReader): a large payload lands in its target memory and
// the next FPDU's headers in the Reader's buffer.
func (s rxSource) ReadVec(a, b []byte) (int, error) {
	s.c.rx.batchEnd()
	if s.c.sr == nil {
		return s.c.nc.Read(a)
	}
	return s.c.read(a, b, false)
}

// TryReadVec is ReadVec without waiting (mpa.NoWaitReader): with nothing
// there it returns mpa.ErrWouldBlock. It does not end the batch: the
// receive reads this way while it holds a region's lock (rxState.place),
// and runs the batch's handlers only when it is about to wait
// (conn.waitReadable). A connection with no syscall.RawConn is read as by
// ReadVec, waiting (it cannot be read without).
func (s rxSource) TryReadVec(a, b []byte) (int, error) {
	c := s.c
	if c.sr == nil {
		return s.ReadVec(a, b)
	}
	n, err := c.read(a, b, true)
	if errors.Is(err, syscall.EAGAIN) {
		return 0, mpa.ErrWouldBlock
	}
	return n, err
}

// waitReadable waits, holding no lock, until the socket has more of the
// FPDU being placed (rxState.place stopped for want of it). It ends the
// batch first, as a read that may wait does. A deadline a kick set is no
// error: inside an FPDU the receive does not pause (see conn.read).
func (c *conn) waitReadable() error {
	c.rx.batchEnd()
	c.placeWaits.Add(1)
	if c.sr == nil {
		return nil // TryReadVec waits
	}
	for {
		err := c.sr.WaitReadable()
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.unkick() {
			return err
		}
	}
}

// kick wakes the transmitter.
func (c *conn) kick() {
	select {
	case c.doorbell <- struct{}{}:
	default:
	}
}

func (c *conn) openGate() { c.gateOnce.Do(func() { close(c.gate) }) }

func (c *conn) setMode(m txMode) {
	for {
		old := txMode(c.mode.Load())
		if old >= m {
			return
		}
		if c.mode.CompareAndSwap(int32(old), int32(m)) {
			c.kick()
			return
		}
	}
}

// fail records the first error of the stream: the QP moves to Terminate and
// the transmitter sends f as a Terminate at the next segment boundary, then
// closes. ev (if non-zero) is raised as an affiliated asynchronous event;
// errors already reported in a completion pass 0. An error after the first,
// or after the peer's Terminate arrived, changes nothing: the QP keeps the
// Terminate it recorded, and a received Terminate is never answered (draft
// T11). A peer's Terminate after this one is not processed either
// (rxState.terminateReceived): f is still sent.
func (c *conn) fail(f rdmap.TerminateFields, ev EventType, detail error) {
	qp := c.qp
	qp.mu.Lock()
	if c.failed {
		qp.mu.Unlock()
		return
	}
	c.failed = true
	c.termOut = &f
	qp.term, qp.termSent = c.termOut, true
	if qp.state == StateRTS || qp.state == StateClosing {
		qp.setStateLocked(StateTerminate)
	}
	qp.mu.Unlock()
	c.log.Info("terminating stream", "cause", f.Cause.String(), "detail", errString(detail))
	c.setMode(txTerminate)
	if ev != 0 {
		c.dev.raise(AsyncEvent{Type: ev, Resource: ResourceQP, QP: qp, QPID: qp.id, Terminate: c.termOut, TerminateSent: true,
			Err: detail})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// terminateLocal is Modify QP RTS->Terminate: a Terminate with RDMAP Local
// Catastrophic Error and no headers (draft Fig. 12).
func (c *conn) terminateLocal() {
	c.fail(localCatastrophic, 0, nil)
}

// closeGracefully is Modify QP RTS->Closing (draft T6).
func (c *conn) closeGracefully() {
	qp := c.qp
	qp.mu.Lock()
	if qp.state != StateRTS {
		qp.mu.Unlock()
		return
	}
	qp.setStateLocked(StateClosing)
	qp.mu.Unlock()
	qp.flushRQ()
	c.settleTx()
	if !qp.sq.empty() || c.respPending() {
		// WQEs still there: Closing -> Error with Bad Close (draft T17).
		c.log.Info("close with work outstanding: resetting", "event", EventBadClose)
		c.abortWith(EventBadClose)
		return
	}
	c.setReadDeadline(time.Now().Add(c.dev.cfg.CloseTimeout))
	c.setMode(txGraceful)
}

// abort resets the connection and waits until the QP is in Error with its
// work flushed (Modify QP ->Error, Destroy QP, device close).
func (c *conn) abort(wait bool) {
	c.abortWith(0)
	if wait {
		<-c.rxDone
	}
}

func (c *conn) abortWith(ev EventType) {
	if !c.aborted.CompareAndSwap(false, true) {
		return
	}
	c.abortEv.Store(uint32(ev))
	if txMode(c.mode.Load()) == txTerminate {
		c.awaitTerminate()
	}
	c.setMode(txAbort)
	c.stopOnce.Do(func() { close(c.stop) })
	c.openGate()
	reset(c.nc)
}

// lastTerminateWait bounds how long a reset waits for the transmitter to
// send the pending Terminate (awaitTerminate). Mostly that is the time for
// the transmit goroutine to be scheduled, which on a loaded machine can
// take longer than the write: at 10 ms, `go test -race ./...` on 2 CPUs
// once reset a stream before its Terminate went out
// (TestTerminateSentWhenDestroyedAtError/direct/4: the peer read "connection
// reset by peer"). Only a peer that does not drain its socket makes a
// reset wait this long.
const lastTerminateWait = 250 * time.Millisecond

// awaitTerminate is the attempt to send the pending Terminate that the
// Terminate state requires ("The RNIC MUST attempt to send the RDMAP
// Terminate Message", draft-hilland-rddp-verbs §6.2.3) when the stream is
// reset before the transmitter sent it, as when a consumer destroys the QP
// at its first error completion: without it the reset would stop the
// transmitter first, and the peer would see a reset with no cause. The
// transmitter sends it as always (txState.run, txTerminate) and stops; a
// write the peer does not drain is given lastTerminateWait, then the reset
// ends it.
func (c *conn) awaitTerminate() {
	t := time.NewTimer(lastTerminateWait)
	defer t.Stop()
	select {
	case <-c.txDone:
	case <-t.C:
	}
}

// reset closes a connection abortively (TCP RST).
func reset(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	nc.Close()
}

// respPending reports whether Read or Atomic Responses are still queued.
func (c *conn) respPending() bool {
	c.respMu.Lock()
	defer c.respMu.Unlock()
	return len(c.resp) > 0
}

// rxEnd is why the receive loop stopped.
type rxEnd uint8

const (
	endEOF      rxEnd = iota // clean EOF at an FPDU boundary (peer FIN)
	endProtocol              // we are terminating (our Terminate is queued)
	endTermRecv              // the peer's Terminate arrived
	endReset                 // connection reset
	endLost                  // other read failure (timeout, truncated FPDU)
	endAbort                 // we reset it ourselves
)

// rxMain runs the receive side, then ends the stream.
func (c *conn) rxMain() {
	defer close(c.rxDone)
	end, err := c.rx.run()
	c.driveEnd()
	c.rx.batchEnd() // what the last batch completed
	c.endOfStream(end, err)
}

// classifyReadErr maps a read failure to an rxEnd.
func (c *conn) classifyReadErr(err error, atBoundary bool) rxEnd {
	if c.aborted.Load() {
		return endAbort
	}
	err = c.streamErr(err)
	if errors.Is(err, io.EOF) {
		// Only while we have not shut down our side: after both FINs the
		// kernel shows the same CLOSE state as after a reset.
		if txMode(c.mode.Load()) == txRun && peerReset(c.nc) {
			return endReset // the transmitter's write took the reset's error
		}
		err = c.streamErr(err) // the transmitter may have recorded its failure meanwhile
	}
	if errors.Is(err, io.EOF) && atBoundary {
		return endEOF
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return endReset
	}
	return endLost
}

// streamErr is what ended the stream when a read failed with err: a failed
// write closes the connection under the receiver (writeFailed), and then
// the write's error (say, a reset seen by the transmitter) is the cause.
// The read may also have returned EOF: after a reset whose error the write
// took, the kernel reports end of stream to the next read.
func (c *conn) streamErr(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		if werr := c.tx.writeErr.Load(); werr != nil {
			return *werr
		}
	}
	return err
}

// drain reads and discards until EOF or the close timeout, so the peer's
// Terminate or FIN can arrive and our FIN is answered. It reports whether
// the close completed cleanly.
func (c *conn) drain() bool {
	c.unkick() // a kick meant for a waiter that drove the receive: none does now
	c.setReadDeadline(time.Now().Add(c.dev.cfg.CloseTimeout))
	for {
		_, err := io.Copy(io.Discard, c.nc)
		// A kick can still land now (one that loaded cq.driving or the
		// baton before the waiter gave the stream back): it is no timeout.
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.unkick() {
			continue
		}
		return err == nil
	}
}

// endOfStream finishes a stream once the receive loop has stopped: it lets
// the transmitter finish (Terminate, FIN), closes the connection and moves
// the QP to Idle or Error, flushing and raising events per draft §6.2.
func (c *conn) endOfStream(end rxEnd, rerr error) {
	qp := c.qp
	qp.mu.Lock()
	st := qp.state
	qp.mu.Unlock()
	var ev EventType
	final := StateError
	switch end {
	case endAbort:
		<-c.txDone
		ev = EventType(c.abortEv.Load())
	case endProtocol:
		<-c.txDone
		if !c.drain() {
			c.log.Debug("peer did not close after our Terminate")
		}
	case endTermRecv:
		c.setMode(txSilent)
		<-c.txDone
		c.drain()
	case endEOF:
		if st == StateRTS {
			c.settleTx()
		}
		switch {
		case st == StateRTS && qp.sq.empty() && !c.respPending() && !c.rx.midMessage():
			qp.mu.Lock()
			qp.setStateLocked(StateClosing)
			qp.mu.Unlock()
			qp.flushRQ()
			c.setMode(txGraceful)
			<-c.txDone
			final, ev = StateIdle, EventLLPCloseComplete
		case st == StateRTS:
			c.fail(rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation,
				Code: term.OpCatastrophicStream}}, EventBadLLPClose, errors.New("peer closed with work outstanding"))
			<-c.txDone
		case st == StateClosing:
			<-c.txDone
			if qp.sq.empty() {
				final, ev = StateIdle, EventLLPCloseComplete
			} else {
				ev = EventBadClose
			}
		default: // Terminate: our Terminate went out and the peer closed.
			<-c.txDone
		}
	case endReset, endLost:
		rerr = c.streamErr(rerr)
		c.setMode(txAbort)
		c.stopOnce.Do(func() { close(c.stop) })
		reset(c.nc)
		<-c.txDone
		switch {
		case st == StateClosing && errors.Is(rerr, os.ErrDeadlineExceeded):
			ev = EventBadClose
		case st == StateClosing || st == StateTerminate:
			ev = EventBadClose
		case end == endReset:
			ev = EventLLPConnectionReset
		default:
			ev = EventLLPConnectionLost
		}
		if rerr != nil {
			c.log.Info("stream lost", "err", rerr)
		}
	}
	c.nc.Close()
	c.detach(final)
	if ev != 0 {
		qp.mu.Lock()
		tf, sent := qp.term, qp.termSent
		qp.mu.Unlock()
		c.dev.raise(AsyncEvent{Type: ev, Resource: ResourceQP, QP: qp, QPID: qp.id, Terminate: tf, TerminateSent: sent, Err: rerr})
	}
}

// settleTx waits, up to settleWait, for the transmitter to finish the
// WQEs it has in hand when the peer's FIN arrives: a Send being written
// out then (on loopback the peer may read it and close before the
// transmitter marks it done) is complete once written, not outstanding
// work that makes the close a bad one.
func (c *conn) settleTx() {
	for deadline := time.Now().Add(settleWait); c.qp.sq.transmitting() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Microsecond)
	}
}

// settleWait bounds settleTx.
const settleWait = 100 * time.Millisecond

// detach completes the move to the final state: every outstanding WQE is
// flushed before Error becomes visible, under qp.mu so that no WR is posted
// between the flush and the state change.
func (c *conn) detach(final QPState) {
	qp := c.qp
	qp.mu.Lock()
	if final == StateError {
		c.rx.flushInProgress()
		qp.flush()
	}
	qp.conn = nil
	qp.setStateLocked(final)
	qp.mu.Unlock()
	qp.cfg.SendCQ.detach(c)
	qp.cfg.RecvCQ.detach(c)
}
