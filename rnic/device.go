package rnic

import (
	crand "crypto/rand"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Config sets an RNIC's limits and behaviour at Open. Zero fields take the
// defaults of DefaultConfig.
type Config struct {
	Name        string
	MaxQP       int
	MaxWR       int // per SQ or RQ
	MaxSRQWR    int
	MaxSGE      int // Send-type and receive WRs
	MaxWriteSGE int
	MaxCQ       int
	MaxCQE      int
	MaxHandlers int
	MaxPD       int
	MaxMR       int // memory regions and windows share the STag table
	MaxMW       int
	MaxPBL      int // buffers in one physical buffer list
	MaxSRQ      int
	MaxIRD      int
	MaxORD      int
	// CloseTimeout bounds a graceful LLP close (draft §6.2.3): after it the
	// close counts as failed and the connection is reset.
	CloseTimeout time.Duration
	// MPATimeout bounds the MPA Request/Reply exchange.
	MPATimeout time.Duration
	// Logger receives the engine's logs (default: slog.Default()).
	Logger *slog.Logger
	// AsyncHandler, if set, is installed before Open returns, so no event is
	// lost (draft §9.4.2).
	AsyncHandler func(AsyncEvent)
	// NoWaitDrive: CQ.Wait never runs a stream's receive itself (drive.go);
	// the receive goroutine wakes it, as for a CQ several streams use. For a
	// consumer whose QPs serve the peer's Reads, Writes and Atomics while
	// it is busy between Waits: with the default, a stream's receive stays
	// with its waiters for a while after each Wait, and what arrives then
	// waits for the next Wait or up to about a millisecond.
	NoWaitDrive bool

	// seed, when set (in-package tests only), replaces the crypto/rand seed
	// of the STag generator so that fuzzing can reach real STags.
	seed *[32]byte
	// lendFor, when set (in-package tests only), replaces lendFor
	// (drive.go).
	lendFor time.Duration
}

// DefaultConfig returns the default limits.
func DefaultConfig() Config {
	return Config{
		Name: "rnic0", MaxQP: 4096, MaxWR: 16384, MaxSRQWR: 65536, MaxSGE: 16, MaxWriteSGE: 16,
		MaxCQ: 4096, MaxCQE: 1 << 20, MaxHandlers: 64, MaxPD: 4096, MaxMR: 1 << 16, MaxMW: 1 << 16,
		MaxPBL: 1 << 20, MaxSRQ: 1024, MaxIRD: 128, MaxORD: 128,
		CloseTimeout: 5 * time.Second, MPATimeout: 10 * time.Second,
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	set(&c.MaxQP, d.MaxQP)
	set(&c.MaxWR, d.MaxWR)
	set(&c.MaxSRQWR, d.MaxSRQWR)
	set(&c.MaxSGE, d.MaxSGE)
	set(&c.MaxWriteSGE, d.MaxWriteSGE)
	set(&c.MaxCQ, d.MaxCQ)
	set(&c.MaxCQE, d.MaxCQE)
	set(&c.MaxHandlers, d.MaxHandlers)
	set(&c.MaxPD, d.MaxPD)
	set(&c.MaxMR, d.MaxMR)
	set(&c.MaxMW, d.MaxMW)
	set(&c.MaxPBL, d.MaxPBL)
	set(&c.MaxSRQ, d.MaxSRQ)
	set(&c.MaxIRD, d.MaxIRD)
	set(&c.MaxORD, d.MaxORD)
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = d.CloseTimeout
	}
	if c.MPATimeout <= 0 {
		c.MPATimeout = d.MPATimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Attrs are the attributes returned by Query RNIC (draft §9.2.1.2).
type Attrs struct {
	Vendor              string
	MaxQP               int
	MaxWR               int
	MaxSRQWR            int
	MaxSGE              int
	MaxWriteSGE         int
	MaxCQ               int
	MaxCQE              int
	MaxHandlers         int
	MaxMR               int
	MaxPBL              int
	MaxPD               int
	MaxInboundReadsRNIC int // 0: IRD resources are per QP, not pooled
	MaxOutboundReadRNIC int // 0: ORD resources are per QP, not pooled
	MaxIRD              int
	MaxORD              int
	CanModifyIRD        bool
	CanIncreaseORD      bool
	MaxMW               int
	CanResizeQP         bool
	PageMode            bool // page-list mode (block-list mode is not offered)
	PageSizes           string
	SRQ                 bool
	CQOverflowDetection bool
	MaxSRQ              int
	SRQArrivalOrder     bool // S-RQ WQEs are taken in arrival order
	Atomics             bool // RFC 7306 Fetch-and-Add and Compare-and-Swap (masked)
	ImmediateData       bool // RFC 7306 Immediate Data
	MaxMessage          uint64
}

// Device is an opened software RNIC. All its verbs are safe for concurrent
// use. Devices share nothing, so several can run in one process.
type Device struct {
	cfg   Config
	log   *slog.Logger
	disp  *dispatcher
	stags *stagTable

	mu       sync.Mutex
	closed   bool
	pds      map[*PD]struct{}
	cqs      map[*CQ]struct{}
	srqs     map[*SRQ]struct{}
	qps      map[uint32]*QP
	nextQPID uint32
	nextPDID uint32
	handlers map[HandlerID]func(*CQ)
	nextHID  HandlerID
	async    func(AsyncEvent)
	lsns     map[*Listener]struct{}

	rngMu sync.Mutex
	rng   *rand.ChaCha8
}

// Open opens a new software RNIC.
func Open(cfg Config) (*Device, error) {
	cfg.fill()
	var seed [32]byte
	if cfg.seed != nil {
		seed = *cfg.seed
	} else if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("rnic: seeding STag generator: %w", err)
	}
	d := &Device{
		cfg:      cfg,
		log:      cfg.Logger.With("rnic", cfg.Name),
		disp:     newDispatcher(),
		pds:      make(map[*PD]struct{}),
		cqs:      make(map[*CQ]struct{}),
		srqs:     make(map[*SRQ]struct{}),
		qps:      make(map[uint32]*QP),
		handlers: make(map[HandlerID]func(*CQ)),
		lsns:     make(map[*Listener]struct{}),
		async:    cfg.AsyncHandler,
		rng:      rand.NewChaCha8(seed),
	}
	d.stags = newStagTable(cfg.MaxMR+cfg.MaxMW, d.random32)
	return d, nil
}

// random32 returns unpredictable bits (ChaCha8 seeded from crypto/rand).
func (d *Device) random32() uint32 {
	d.rngMu.Lock()
	v := d.rng.Uint64()
	d.rngMu.Unlock()
	return uint32(v)
}

// RandomKey returns an unpredictable STag key, for consumers that want a
// fresh key for every registration.
func (d *Device) RandomKey() uint8 { return uint8(d.random32()) }

// Name is the device's name.
func (d *Device) Name() string { return d.cfg.Name }

// Query returns the device attributes.
func (d *Device) Query() Attrs {
	c := d.cfg
	return Attrs{
		Vendor: "rnic-dev software iWARP (RFC 5040/5041/5044/6581/7306)", MaxQP: c.MaxQP, MaxWR: c.MaxWR,
		MaxSRQWR: c.MaxSRQWR, MaxSGE: c.MaxSGE, MaxWriteSGE: c.MaxWriteSGE, MaxCQ: c.MaxCQ,
		MaxCQE: c.MaxCQE, MaxHandlers: c.MaxHandlers, MaxMR: c.MaxMR, MaxPBL: c.MaxPBL, MaxPD: c.MaxPD,
		MaxIRD: c.MaxIRD, MaxORD: c.MaxORD, CanModifyIRD: true, CanIncreaseORD: true, MaxMW: c.MaxMW,
		CanResizeQP: true, PageMode: true, PageSizes: "any power of two >= 8, or one contiguous buffer",
		SRQ: true, CQOverflowDetection: true, MaxSRQ: c.MaxSRQ, SRQArrivalOrder: true,
		Atomics: true, ImmediateData: true, MaxMessage: 1<<32 - 1,
	}
}

// SetAsyncHandler installs the asynchronous event handler (nil disables it;
// events raised while none is set are lost, draft §9.4.2).
func (d *Device) SetAsyncHandler(h func(AsyncEvent)) {
	d.mu.Lock()
	d.async = h
	d.mu.Unlock()
}

// raise delivers an asynchronous event through the dispatcher.
func (d *Device) raise(ev AsyncEvent) {
	d.mu.Lock()
	h := d.async
	d.mu.Unlock()
	d.log.Debug("async event", "event", ev.String())
	if h == nil {
		return
	}
	d.disp.post(func() { h(ev) })
}

// HandlerID identifies a completion event handler (draft §9.4.1).
type HandlerID uint32

// SetCompletionHandler registers (id 0), replaces (id != 0, h != nil) or
// clears (id != 0, h == nil) a completion event handler. Handlers run on the
// device's dispatcher goroutine and may call any verb.
func (d *Device) SetCompletionHandler(id HandlerID, h func(*CQ)) (HandlerID, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, ErrClosed
	}
	if id == 0 {
		if h == nil {
			return 0, fmt.Errorf("rnic: register completion handler: %w: nil handler", ErrInvalidModifier)
		}
		if len(d.handlers) >= d.cfg.MaxHandlers {
			return 0, fmt.Errorf("rnic: register completion handler: %w", ErrInsufficientResources)
		}
		d.nextHID++
		d.handlers[d.nextHID] = h
		return d.nextHID, nil
	}
	if _, ok := d.handlers[id]; !ok {
		return 0, fmt.Errorf("rnic: completion handler %d: %w", id, ErrInvalidHandler)
	}
	if h == nil {
		// Cleared: CQs still naming it get no calls (a no-op, draft C4.8).
		d.handlers[id] = nil
		return id, nil
	}
	d.handlers[id] = h
	return id, nil
}

func (d *Device) handler(id HandlerID) func(*CQ) {
	if id == 0 {
		return nil
	}
	d.mu.Lock()
	h := d.handlers[id]
	d.mu.Unlock()
	return h
}

// Close tears down every QP (resetting live connections), listener and
// resource opened through this device, and stops its goroutines: it returns
// once every stream's receive and transmit goroutines have ended, or after
// Config.CloseTimeout if some have not.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := make([]*QP, 0, len(d.qps))
	for _, qp := range d.qps {
		qps = append(qps, qp)
	}
	lsns := make([]*Listener, 0, len(d.lsns))
	for l := range d.lsns {
		lsns = append(lsns, l)
	}
	d.mu.Unlock()
	for _, l := range lsns {
		l.Close()
	}
	var conns []*conn
	for _, qp := range qps {
		if c := qp.teardown(); c != nil {
			conns = append(conns, c)
		}
	}
	if len(conns) > 0 {
		timeout := time.NewTimer(d.cfg.CloseTimeout)
	wait:
		for _, c := range conns {
			for _, done := range []chan struct{}{c.rxDone, c.txDone} {
				select {
				case <-done:
				case <-timeout.C:
					d.log.Warn("close: stream goroutines still running after the close timeout")
					break wait
				}
			}
		}
		timeout.Stop()
	}
	d.stags.clear()
	d.mu.Lock()
	d.pds = map[*PD]struct{}{}
	d.cqs = map[*CQ]struct{}{}
	d.srqs = map[*SRQ]struct{}{}
	d.qps = map[uint32]*QP{}
	d.handlers = map[HandlerID]func(*CQ){}
	d.mu.Unlock()
	d.disp.close()
	return nil
}
