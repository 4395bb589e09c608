// Package endpoint is the message endpoint both ends of the block protocol
// (and any other protocol of Sends, RDMA Reads and Writes) are built on:
// one RC QP with its own completion queue, a ring of registered receive
// buffers kept posted, registered send areas, the completion loop that
// hands completions to the protocol, and the teardown order that frees
// memory only once the engine is done with it. pool.go adds a budgeted
// pool of data buffers.
//
// An Endpoint goes through three phases:
//
//   - set up: New creates the PD (or uses the caller's), CQ and QP,
//     registers the receive and send buffers and posts receives; the
//     caller connects the QP (connection manager) and may exchange its
//     login messages with WaitRecv;
//   - running: Start runs the completion loop, which hands every batch of
//     completions to the protocol's handler;
//   - torn down: Close resets the connection if it is still up, waits
//     until the engine no longer touches the endpoint's memory (the QP in
//     Error or Idle), stops the loop, lets the caller release what it
//     registered, and frees the registrations, QP, CQ and PD.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/rnic"
)

// Config describes an Endpoint.
type Config struct {
	Device *rnic.Device
	// PD is the protection domain of the QP and every registration; nil
	// gives the endpoint a PD of its own (freed by Close), so that no STag
	// registered for it is usable from any other QP.
	PD *rnic.PD
	// QP is the QP's configuration. SendCQ and RecvCQ are the endpoint's
	// CQ (any given are ignored); RQDepth defaults to Receives; SQDepth
	// must be set. MaxSendSGE and MaxRecvSGE default to 1.
	QP rnic.QPConfig
	// Receives receive buffers of RecvSize bytes each are registered;
	// PostReceives posts them (New posts Posted of them).
	Receives, RecvSize int
	// Posted is how many receives New posts: buffers 0 to Posted-1
	// (negative: none; 0: all).
	Posted int
	// SendAreas send areas of SendSize bytes each are registered for
	// the messages this side sends.
	SendAreas, SendSize int
	// CQEntries sizes the CQ; 0: RQDepth + SQDepth + 8.
	CQEntries int
	// Direct runs the handler to completion where the completions arise:
	// on the engine's receive goroutine, at the end of each batch it read
	// from the connection (rnic.CQ.SetDirectHandler), with no hand-off to
	// the loop's goroutine; only the completions the engine queues
	// otherwise (send completions, flushes) go through the loop. The
	// handler must then never block for long: no store I/O, no waiting for
	// other completions or for the QP's state.
	Direct bool
}

// Endpoint is one QP with its buffers and its completion loop.
type Endpoint struct {
	PD *rnic.PD
	CQ *rnic.CQ
	QP *rnic.QP

	ownPD bool

	recvBuf  []byte
	recvMR   *rnic.MR
	recvSize int
	recvSGE  []rnic.SGE
	recvWR   []rnic.RecvWR

	sendBuf  []byte
	sendMR   *rnic.MR
	sendSize int

	// mu guards mrs and freed, and is held across each registration made
	// through the endpoint (keep): a registration either is in mrs when
	// free takes the list, or is never made.
	mu    sync.Mutex
	mrs   []*rnic.MR // registered or allocated through the endpoint; freed by Close
	freed bool       // free has taken mrs: no more registrations

	ctx     context.Context // ends when the loop must stop
	cancel  context.CancelFunc
	loop    sync.WaitGroup
	started bool
	// closing: Close has begun (under mu), so a Start that comes after it
	// (a server's shutdown racing the accept of a new connection) starts
	// nothing, and Close's wait for the loop orders after any Start before it.
	closing bool
	direct  bool

	// hmu serializes the handler: the loop and the direct handler each
	// poll and handle under it, so completions are handled in CQ order.
	hmu     sync.Mutex
	handler Handler
	done    bool // the handler returned false (hmu held)
	wcs     [64]rnic.WC

	closeOnce sync.Once
}

// New creates an endpoint: PD (unless given), CQ, QP, the registered
// receive and send buffers, and the first receives posted.
func New(cfg Config) (*Endpoint, error) {
	if cfg.Device == nil || cfg.Receives <= 0 || cfg.RecvSize <= 0 || cfg.QP.SQDepth <= 0 {
		return nil, errors.New("endpoint: Config needs Device, Receives, RecvSize and QP.SQDepth")
	}
	e := &Endpoint{PD: cfg.PD, recvSize: cfg.RecvSize, sendSize: cfg.SendSize, direct: cfg.Direct}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	var err error
	if e.PD == nil {
		if e.PD, err = cfg.Device.AllocPD(); err != nil {
			return nil, fmt.Errorf("endpoint: allocate PD: %w", err)
		}
		e.ownPD = true
	}
	qc := cfg.QP
	if qc.RQDepth <= 0 {
		qc.RQDepth = cfg.Receives
	}
	qc.MaxSendSGE = max(qc.MaxSendSGE, 1)
	qc.MaxRecvSGE = max(qc.MaxRecvSGE, 1)
	n := cfg.CQEntries
	if n <= 0 {
		n = qc.RQDepth + qc.SQDepth + 8
	}
	if e.CQ, err = cfg.Device.CreateCQ(n, 0); err != nil {
		e.free()
		return nil, fmt.Errorf("endpoint: create CQ: %w", err)
	}
	qc.SendCQ, qc.RecvCQ = e.CQ, e.CQ
	if e.QP, err = e.PD.CreateQP(qc); err != nil {
		e.free()
		return nil, fmt.Errorf("endpoint: create QP: %w", err)
	}
	e.recvBuf = make([]byte, cfg.Receives*cfg.RecvSize)
	if e.recvMR, err = e.PD.RegisterBytes(e.recvBuf, rnic.LocalWrite); err != nil {
		e.free()
		return nil, fmt.Errorf("endpoint: register receive buffers: %w", err)
	}
	if cfg.SendAreas > 0 && cfg.SendSize > 0 {
		e.sendBuf = make([]byte, cfg.SendAreas*cfg.SendSize)
		if e.sendMR, err = e.PD.RegisterBytes(e.sendBuf, rnic.LocalRead|rnic.LocalWrite); err != nil {
			e.free()
			return nil, fmt.Errorf("endpoint: register send areas: %w", err)
		}
	}
	e.recvSGE = make([]rnic.SGE, cfg.Receives)
	e.recvWR = make([]rnic.RecvWR, cfg.Receives)
	for i := range e.recvWR {
		e.recvSGE[i] = rnic.SGE{STag: e.recvMR.STag(), TO: uint64(i * cfg.RecvSize), Len: uint32(cfg.RecvSize)}
		e.recvWR[i] = rnic.RecvWR{ID: uint64(i), SGL: e.recvSGE[i : i+1]}
	}
	posted := cfg.Posted
	if posted == 0 {
		posted = cfg.Receives
	}
	if posted > 0 {
		if err := e.PostReceives(0, min(posted, cfg.Receives)); err != nil {
			e.free()
			return nil, err
		}
	}
	return e, nil
}

// Receives is the number of receive buffers.
func (e *Endpoint) Receives() int { return len(e.recvWR) }

// Recv returns receive buffer i (a completion's WC.ID names it).
func (e *Endpoint) Recv(i int) []byte { return e.recvBuf[i*e.recvSize : (i+1)*e.recvSize] }

// Received returns the message a receive completion delivered.
func (e *Endpoint) Received(wc *rnic.WC) []byte { return e.Recv(int(wc.ID))[:wc.Bytes] }

// Repost posts receive buffer i again.
func (e *Endpoint) Repost(i int) error {
	if _, err := e.QP.PostRecv(e.recvWR[i]); err != nil {
		return fmt.Errorf("endpoint: post receive: %w", err)
	}
	return nil
}

// PostReceives posts receive buffers first to first+n-1.
func (e *Endpoint) PostReceives(first, n int) error {
	if _, err := e.QP.PostRecv(e.recvWR[first : first+n]...); err != nil {
		return fmt.Errorf("endpoint: post receives: %w", err)
	}
	return nil
}

// Area returns send area i.
func (e *Endpoint) Area(i int) []byte { return e.Areas(i, 1) }

// Areas returns send areas i to i+k-1 as one buffer.
func (e *Endpoint) Areas(i, k int) []byte { return e.sendBuf[i*e.sendSize : (i+k)*e.sendSize] }

// AreaSGE names the first n bytes from the start of send area i.
func (e *Endpoint) AreaSGE(i, n int) rnic.SGE {
	return rnic.SGE{STag: e.sendMR.STag(), TO: uint64(i * e.sendSize), Len: uint32(n)}
}

// ErrClosed is what a registration through an endpoint that Close has
// torn down returns.
var ErrClosed = errors.New("endpoint closed")

// Register registers b in the endpoint's PD; Close deregisters it. Once
// Close has freed the endpoint's registrations it fails with ErrClosed.
func (e *Endpoint) Register(b []byte, acc rnic.Access) (*rnic.MR, error) {
	return e.keep("register", func() (*rnic.MR, error) { return e.PD.RegisterBytes(b, acc) })
}

// RegisterMR registers memory with options in the endpoint's PD; Close
// deregisters it. Once Close has freed the endpoint's registrations it
// fails with ErrClosed.
func (e *Endpoint) RegisterMR(m rnic.Memory, o rnic.MROptions) (*rnic.MR, error) {
	return e.keep("register", func() (*rnic.MR, error) { return e.PD.RegisterMR(m, o) })
}

// AllocSTag allocates an STag for Fast-Register work requests (one buffer;
// remote: remote access may be granted through it); Close frees it. Once
// Close has freed the endpoint's registrations it fails with ErrClosed.
func (e *Endpoint) AllocSTag(remote bool) (*rnic.MR, error) {
	return e.keep("allocate STag", func() (*rnic.MR, error) { return e.PD.AllocMRSTag(1, remote) })
}

// keep makes a registration (reg) and records it for Close, holding e.mu
// throughout: a registration racing Close (a QP joining a session that
// ends meanwhile) is either freed with the rest or refused. Made after
// free had taken the list, it would stay registered, in a PD the caller
// shares, or in the endpoint's own, which it would keep from being freed.
func (e *Endpoint) keep(what string, reg func() (*rnic.MR, error)) (*rnic.MR, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.freed {
		return nil, fmt.Errorf("endpoint: %s: %w", what, ErrClosed)
	}
	mr, err := reg()
	if err != nil {
		return nil, err
	}
	e.mrs = append(e.mrs, mr)
	return mr, nil
}

// WaitRecv waits for the next receive completion before Start (a login
// exchange), skipping send completions. A failed completion is an error.
func (e *Endpoint) WaitRecv(ctx context.Context) (rnic.WC, []byte, error) {
	var wc [1]rnic.WC
	for {
		if _, err := e.CQ.Wait(ctx, wc[:]); err != nil {
			return rnic.WC{}, nil, err
		}
		if wc[0].Status != rnic.StatusSuccess {
			return wc[0], nil, wc[0].Err()
		}
		if wc[0].Op == rnic.WRRecv {
			return wc[0], e.Received(&wc[0]), nil
		}
	}
}

// Context ends when the endpoint stops (Kill, Close): work the protocol
// runs for the endpoint (store calls, worker goroutines) uses it.
func (e *Endpoint) Context() context.Context { return e.ctx }

// Handler handles a batch of completions in order; it returns false to
// stop the loop. Work requests it posts leave together once it returns
// (the QP is plugged around it).
type Handler func(wcs []rnic.WC) bool

// Start runs the completion loop in a goroutine of its own (and, with
// Config.Direct, the direct handler) until the handler returns false or
// Close (or Kill) stops it.
func (e *Endpoint) Start(h Handler) {
	e.mu.Lock()
	if e.started {
		e.mu.Unlock()
		panic("endpoint: Start called twice")
	}
	e.started = true
	if e.closing {
		e.mu.Unlock()
		return
	}
	e.handler = h
	e.loop.Add(1)
	if e.direct {
		// Under mu too: a Close that follows clears it, never one that
		// came before.
		e.CQ.SetDirectHandler(e.runDirect)
	}
	e.mu.Unlock()
	go e.run()
}

func (e *Endpoint) run() {
	defer e.loop.Done()
	for {
		if !e.drain() {
			return
		}
		// Yield a few times before parking: a completion that lands
		// meanwhile costs no wake-up.
		for i := 0; i < spinYields && !e.pending(); i++ {
			runtime.Gosched()
		}
		if e.pending() {
			continue
		}
		if err := e.CQ.RequestNotify(false); err != nil {
			return
		}
		if e.pending() {
			continue
		}
		select {
		case <-e.CQ.C():
		case <-e.ctx.Done():
			return
		}
	}
}

// spinYields is how many times the loop yields before it parks.
const spinYields = 16

func (e *Endpoint) pending() bool { return e.CQ.Len() > 0 }

// runDirect is the CQ's direct handler: it handles what is queued unless
// the loop is at it (then the engine notifies the loop).
func (e *Endpoint) runDirect() bool {
	if !e.hmu.TryLock() {
		return false
	}
	e.handleLocked()
	e.hmu.Unlock()
	return true
}

// drain handles what is queued (behind a direct handler running now);
// false once the handler has returned false.
func (e *Endpoint) drain() bool {
	e.hmu.Lock()
	defer e.hmu.Unlock()
	return e.handleLocked()
}

// handleLocked polls and handles until the CQ is empty (hmu held). When
// the handler returns false, the endpoint stops: the loop ends and later
// completions are left in the CQ.
func (e *Endpoint) handleLocked() bool {
	for !e.done {
		n := e.CQ.Poll(e.wcs[:])
		if n == 0 {
			return true
		}
		e.QP.Plug()
		ok := e.handler(e.wcs[:n])
		e.QP.Unplug()
		if !ok {
			e.done = true
			e.cancel()
		}
	}
	return false
}

// Reset resets the connection if it is up, without waiting (the reset
// itself runs in a goroutine of its own, so that a handler running on the
// engine's receive goroutine may call it): the engine then flushes the
// work requests, and the loop hands their completions to the handler,
// which sees the end that way.
func (e *Endpoint) Reset() {
	if e.QP.State() == rnic.StateRTS {
		go e.QP.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
}

// Kill resets the connection if it is up and stops the loop, without
// waiting for either: it may be called from the handler. Completions not
// yet handled are dropped.
func (e *Endpoint) Kill() {
	e.Reset()
	e.cancel()
}

// Stopped waits (up to a minute) until the QP is in Error or Idle: from
// then on the engine no longer touches the endpoint's memory. It resets
// a connection still up first.
func (e *Endpoint) Stopped() {
	if e.QP.State() == rnic.StateRTS {
		e.QP.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.QP.WaitState(ctx, rnic.StateError, rnic.StateIdle)
}

// AwaitClose waits up to timeout for the peer to close the connection
// (Idle after its FIN, or Error), and resets it if it has not by then: for
// a peer that said it is leaving.
func (e *Endpoint) AwaitClose(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	e.QP.WaitState(ctx, rnic.StateIdle, rnic.StateError)
	cancel()
	if st := e.QP.State(); st == rnic.StateRTS || st == rnic.StateClosing {
		e.QP.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
}

// CloseGracefully ends a connection that is up with FIN both ways (the
// peer sees an orderly close), waiting up to timeout; a connection that
// does not get to Idle in time is reset.
func (e *Endpoint) CloseGracefully(timeout time.Duration) {
	switch e.QP.State() {
	case rnic.StateRTS:
		if e.QP.Modify(rnic.StateClosing, rnic.ModifyAttrs{}) != nil {
			return
		}
	case rnic.StateClosing: // closing already (the peer's FIN, or ours): wait for it
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	e.QP.WaitState(ctx, rnic.StateIdle, rnic.StateError)
	cancel()
	if st := e.QP.State(); st == rnic.StateRTS || st == rnic.StateClosing {
		e.QP.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
}

// Close tears the endpoint down, in this order: the connection is reset
// if it is still up; Close waits until the engine is done with every
// buffer (Stopped); the loop is stopped and waited for; release (if not
// nil) frees what the caller built on the endpoint; then every
// registration, the QP, the CQ and an own PD are freed. From then on a
// registration through the endpoint fails with ErrClosed. It must not be
// called from the handler (use Kill there). Safe to call more than once;
// later calls do nothing.
func (e *Endpoint) Close(release func()) error {
	var err error
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closing = true
		e.mu.Unlock()
		e.Stopped()
		e.CQ.SetDirectHandler(nil)
		e.cancel()
		e.loop.Wait()
		if release != nil {
			release()
		}
		err = e.free()
	})
	return err
}

// free releases everything New and the registrations created. The fields
// keep their (now dead) values: a racing poster then fails cleanly on the
// destroyed QP instead of dereferencing nil.
func (e *Endpoint) free() error {
	var errs []error
	e.mu.Lock()
	mrs := e.mrs
	e.mrs, e.freed = nil, true
	e.mu.Unlock()
	for _, mr := range append(mrs, e.recvMR, e.sendMR) {
		if mr != nil {
			if err := mr.Dealloc(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if e.QP != nil {
		if err := e.QP.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if e.CQ != nil {
		if err := e.CQ.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if e.ownPD && e.PD != nil {
		if err := e.PD.Dealloc(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("endpoint: releasing: %w", err)
	}
	return nil
}
