package target

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// ErrClosed is returned by Serve after Shutdown or Close.
var ErrClosed = errors.New("target: closed")

// Target serves volumes of a store to initiators over RNIC connections.
type Target struct {
	cfg    Config
	log    *slog.Logger
	m      *Metrics
	dev    *rnic.Device
	pool   *endpoint.Pool
	bootID uint64
	logins chan struct{} // semaphore of logins in progress

	// grantBytes counts buffer bytes held by write grants; grants may use
	// at most half of BufferBytes, so READs always find memory.
	grantBytes atomic.Int64

	stop     chan struct{} // closed by Shutdown/Close: Serve loops return
	stopOnce sync.Once

	mu       sync.Mutex
	vols     map[string]*volume
	opening  map[string]chan struct{} // volumes being opened: closed when done
	sessions map[uint64]*session
	pending  map[*conn]struct{} // QPs still logging in
	closed   bool

	// active counts commands being executed; Shutdown waits for it to
	// drop to zero once draining is set.
	actMu    sync.Mutex
	active   int
	draining bool
	idle     *sync.Cond

	wg sync.WaitGroup // connection goroutines
}

// New returns a Target. It does not listen: call Serve.
func New(cfg Config) (*Target, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("target: boot ID: %w", err)
	}
	maxBuf := cfg.MaxTransfer + 2*store.BlockSize
	t := &Target{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, dev: cfg.Device,
		pool: endpoint.NewPool(store.BlockSize, maxBuf, cfg.BufferBytes), bootID: binary.LittleEndian.Uint64(b[:]) | 1,
		logins: make(chan struct{}, cfg.MaxLogins), stop: make(chan struct{}),
		vols: make(map[string]*volume), opening: make(map[string]chan struct{}), sessions: make(map[uint64]*session), pending: make(map[*conn]struct{})}
	t.idle = sync.NewCond(&t.actMu)
	return t, nil
}

// Metrics returns the target's counters.
func (t *Target) Metrics() *Metrics { return t.m }

// BootID is this target incarnation's ID, sent in every WELCOME.
func (t *Target) BootID() uint64 { return t.bootID }

// Acceptor is what Serve takes connection requests from: an
// *rnic.Listener, or one side of a listener shared with another protocol.
type Acceptor interface {
	Accept(ctx context.Context) (*rnic.ConnRequest, error)
}

// Serve accepts connection requests from l until ctx ends, Shutdown or
// Close is called (then it returns ErrClosed), or l fails.
func (t *Target) Serve(ctx context.Context, l Acceptor) error {
	return AcceptEach(ctx, l, t.stop, func(req *rnic.ConnRequest) error {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			req.Reject(nil)
			return ErrClosed
		}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			t.handle(req)
		}()
		return nil
	})
}

// AcceptEach takes the connection requests of l and hands each to handle,
// until ctx ends (its error), stop is closed (ErrClosed), l fails (that
// error), or handle returns an error (that error). Both front ends serve
// their listeners with it.
func AcceptEach(ctx context.Context, l Acceptor, stop <-chan struct{}, handle func(*rnic.ConnRequest) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			select {
			case <-stop:
				return ErrClosed
			default:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("target: listener closed: %w", err)
			}
			return err
		}
		if err := handle(req); err != nil {
			return err
		}
	}
}

// begin counts a command in execution; it reports false while draining.
func (t *Target) begin() bool {
	t.actMu.Lock()
	defer t.actMu.Unlock()
	if t.draining {
		return false
	}
	t.active++
	return true
}

func (t *Target) end() {
	t.actMu.Lock()
	t.active--
	if t.active == 0 && t.draining {
		t.idle.Broadcast()
	}
	t.actMu.Unlock()
}

// isDraining reports whether Shutdown has begun.
func (t *Target) isDraining() bool {
	t.actMu.Lock()
	defer t.actMu.Unlock()
	return t.draining
}

// Shutdown stops the target gracefully: it stops accepting connections
// and commands, waits for the commands in execution to finish and be
// answered, flushes every open volume, says GOODBYE on every QP (everything
// acknowledged is then durable), closes the connections, ends the sessions
// and closes the volumes. If ctx ends first, the rest is done abruptly (no
// waiting), and ctx's error is returned. The store is the caller's to
// close.
func (t *Target) Shutdown(ctx context.Context) error {
	t.stopOnce.Do(func() { close(t.stop) })
	t.actMu.Lock()
	t.draining = true
	drained := make(chan struct{})
	go func() {
		for t.active > 0 {
			t.idle.Wait()
		}
		t.actMu.Unlock()
		close(drained)
	}()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = fmt.Errorf("target: shutdown: waiting for commands in flight: %w", ctx.Err())
	}
	t.mu.Lock()
	t.closed = true
	// Each volume is flushed under a reference of Shutdown's own: a session
	// ending meanwhile (its initiator gone) must not close the handle while
	// the flush runs on it.
	vols := make([]*volume, 0, len(t.vols))
	for _, v := range t.vols {
		v.refs++
		vols = append(vols, v)
	}
	sess := make([]*session, 0, len(t.sessions))
	for _, s := range t.sessions {
		sess = append(sess, s)
	}
	pend := make([]*conn, 0, len(t.pending))
	for c := range t.pending {
		// A QP its session took is the session's (goodbye and end
		// below), though its login has not returned yet: killing it
		// here reset a QP the initiator had just been welcomed on.
		if !c.inSession.Load() {
			pend = append(pend, c)
		}
	}
	t.mu.Unlock()
	if err == nil {
		for _, v := range vols {
			if ferr := v.v.Flush(ctx); ferr != nil {
				err = errors.Join(err, fmt.Errorf("target: shutdown: flushing %q: %w", v.name, ferr))
			}
		}
	}
	for _, v := range vols {
		t.releaseVolume(v)
	}
	for _, c := range pend {
		c.kill()
	}
	var wg sync.WaitGroup
	for _, s := range sess {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.goodbye(ctx, err == nil)
			s.end("target shutdown")
		}()
	}
	wg.Wait()
	t.wg.Wait()
	return err
}

// Close is Shutdown without waiting: sessions are ended at once.
func (t *Target) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := t.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
