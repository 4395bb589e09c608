package nvmf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// Defaults of Config.
const (
	DefaultInCapsule   = 4096
	DefaultMaxTransfer = 1 << 20
	DefaultORD         = 32
	DefaultIOQueues    = 16
	DefaultBufferBytes = 256 << 20
)

// Config configures a Server.
type Config struct {
	// Target is the native-protocol target whose volumes this server
	// serves: both front ends share each volume's store handle and lock
	// table (see target.FrontendSession).
	Target *target.Target
	// Store lists the volumes (discovery, NQN lookup).
	Store  store.Store
	Device *rnic.Device
	Logger *slog.Logger
	// Metrics: nil allocates the server's own.
	Metrics *Metrics

	// NQNPrefix names volume NAME's subsystem NQNPrefix+NAME:
	// DefaultNQNPrefix by default.
	NQNPrefix string
	// Hosts is the allow-list of host NQNs of each volume. A volume with
	// no list admits hosts connecting from a loopback address only.
	Hosts map[string][]string
	// Advertise is the "host:port" discovery log entries give as the
	// subsystems' transport address; "" gives the address the discovery
	// connection reached.
	Advertise string

	// InCapsule is the most data a host may send in a command capsule on an
	// I/O queue (IOCCSZ = (64 + InCapsule) / 16): 4096; a multiple of 16.
	InCapsule int
	// MaxTransfer is the largest data transfer of one command (MDTS): 1
	// MiB; a power of two from 8 KiB to 1 MiB. (MDTS is a power of two of
	// 4 KiB pages, and 0 says there is no limit: 4 KiB cannot be told.)
	MaxTransfer int
	// ORD is the most RDMA Reads each queue keeps outstanding (the host's
	// IRD lowers it on MPA revision 2): 32, at most 128.
	ORD int
	// IOQueues is the most I/O queues of a controller: 16.
	IOQueues int
	// BufferBytes bounds the memory of data buffers in use: 256 MiB.
	BufferBytes int64
	// WriteBack acknowledges writes and write-zeroes before they are
	// durable (the store's own write-back; Flush and FUA still reach its
	// sync). Off by default: every write is made durable before its
	// completion (FUA), because a host outlives a crash of the target
	// process, reconnects and replays its Flush to the new incarnation,
	// which would report durable writes the crash lost. NVMe has no way to
	// tell the host (the native protocol has: its boot ID).
	WriteBack bool
	// CRC asks for MPA CRCs on every connection; without it they are used
	// when the host asks (Linux siw does not by default).
	CRC bool
	// KATOGrace is added to the host's keep alive timeout before a silent
	// controller is dropped: 0.
	KATOGrace time.Duration
}

// DefaultNQNPrefix is the subsystem NQN of volume NAME without NAME.
const DefaultNQNPrefix = "nqn.2026-11.dev.rnic:"

func (c *Config) fill() error {
	if c.Target == nil || c.Store == nil || c.Device == nil {
		return errors.New("nvmf: Config needs Target, Store and Device")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = new(Metrics)
	}
	if c.NQNPrefix == "" {
		c.NQNPrefix = DefaultNQNPrefix
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.InCapsule, DefaultInCapsule)
	def(&c.MaxTransfer, DefaultMaxTransfer)
	def(&c.ORD, DefaultORD)
	def(&c.IOQueues, DefaultIOQueues)
	if c.BufferBytes == 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	switch {
	case c.InCapsule < 0 || c.InCapsule%16 != 0 || c.InCapsule > 64<<10:
		return fmt.Errorf("nvmf: InCapsule %d: want a multiple of 16 up to 64 KiB", c.InCapsule)
	case c.MaxTransfer < 2*store.BlockSize || c.MaxTransfer > 1<<20 || c.MaxTransfer&(c.MaxTransfer-1) != 0:
		return fmt.Errorf("nvmf: MaxTransfer %d: want a power of two from 8 KiB to 1 MiB", c.MaxTransfer)
	case c.ORD < 1 || c.ORD > 128:
		return fmt.Errorf("nvmf: ORD %d: want 1-128", c.ORD)
	case c.IOQueues < 1 || c.IOQueues > 1024:
		return fmt.Errorf("nvmf: IOQueues %d: want 1-1024", c.IOQueues)
	case c.BufferBytes < int64(2*c.MaxTransfer):
		return fmt.Errorf("nvmf: BufferBytes %d is below two maximum transfers", c.BufferBytes)
	}
	for vol, hosts := range c.Hosts {
		for _, h := range hosts {
			if !ValidNQN(h) {
				return fmt.Errorf("nvmf: host NQN %q for volume %s: want nqn.YYYY-MM.domain:name or nqn.2014-08.org.nvmexpress:uuid:UUID, at most %d bytes",
					h, vol, MaxNQNLen)
			}
		}
	}
	return nil
}

// Server is an NVMe/RDMA target: a discovery controller and one NVM
// subsystem per volume, each volume its namespace 1.
type Server struct {
	cfg  Config
	log  *slog.Logger
	m    *Metrics
	bufs *endpoint.Pool
	// bufsOut counts the data buffers taken from bufs and not given back.
	bufsOut atomic.Int64

	stop     chan struct{}
	stopOnce sync.Once

	mu       sync.Mutex
	ctrls    map[uint16]*controller
	queues   map[*queue]struct{}
	nextID   uint16
	closed   bool
	discGen  uint64
	accepted sync.WaitGroup // handshakes in progress
}

// New returns a Server; Serve (or Handle) feeds it connections.
func New(cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger.With("frontend", "nvmf"), m: cfg.Metrics,
		bufs: endpoint.NewPool(store.BlockSize, 1<<20, cfg.BufferBytes), stop: make(chan struct{}),
		ctrls: make(map[uint16]*controller), queues: make(map[*queue]struct{})}, nil
}

// Metrics returns the server's counters.
func (s *Server) Metrics() *Metrics { return s.m }

// NQN is the subsystem NQN of volume name.
func (s *Server) NQN(volume string) string { return s.cfg.NQNPrefix + volume }

// volumeOf returns the volume a subsystem NQN names.
func (s *Server) volumeOf(nqn string) (string, bool) {
	v, ok := strings.CutPrefix(nqn, s.cfg.NQNPrefix)
	return v, ok && v != ""
}

// Serve handles the connection requests of l until ctx ends, Shutdown is
// called (then it returns target.ErrClosed), or l fails.
func (s *Server) Serve(ctx context.Context, l target.Acceptor) error {
	return target.AcceptEach(ctx, l, s.stop, func(req *rnic.ConnRequest) error {
		s.Handle(req)
		return nil
	})
}

// Handle answers one connection request (in the background): an NVMe/RDMA
// queue is accepted or the request rejected.
func (s *Server) Handle(req *rnic.ConnRequest) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		req.Reject(nil)
		return
	}
	s.accepted.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.accepted.Done()
		s.accept(req)
	}()
}

// allowed reports whether a host may use volume: its NQN is on the
// volume's allow-list or, for a volume without one, it connects from a
// loopback address.
func (s *Server) allowed(volume, hostNQN string, remote net.Addr) bool {
	list := s.cfg.Hosts[volume]
	if len(list) == 0 {
		return isLoopback(remote)
	}
	for _, h := range list {
		if h == hostNQN {
			return true
		}
	}
	return false
}

func isLoopback(a net.Addr) bool {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.IsLoopback()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// addController registers a new controller and gives it a controller ID
// (1 to 0xFFEF, NVMe Base 2.0 §3.1.3.1: IDs above are reserved).
func (s *Server) addController(c *controller) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.ctrls) >= 0xffef {
		return false
	}
	for {
		s.nextID++
		if s.nextID == 0 || s.nextID > 0xffef {
			s.nextID = 1
		}
		if _, used := s.ctrls[s.nextID]; !used {
			break
		}
	}
	c.id = s.nextID
	s.ctrls[c.id] = c
	return true
}

func (s *Server) removeController(c *controller) {
	s.mu.Lock()
	if s.ctrls[c.id] == c {
		delete(s.ctrls, c.id)
	}
	s.mu.Unlock()
}

func (s *Server) controller(id uint16) *controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctrls[id]
}

// Shutdown stops accepting, drops every controller (flushing its volume
// first when ctx allows), and waits for the queues to be torn down.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.mu.Lock()
	s.closed = true
	ctrls := make([]*controller, 0, len(s.ctrls))
	for _, c := range s.ctrls {
		ctrls = append(ctrls, c)
	}
	qs := make([]*queue, 0, len(s.queues))
	for q := range s.queues {
		qs = append(qs, q)
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range ctrls {
		if c.fe == nil || ctx.Err() != nil {
			continue
		}
		if err := c.fe.Volume().Flush(ctx); err != nil {
			c.mu.Lock()
			ended := c.ended
			c.mu.Unlock()
			if ended && errors.Is(err, store.ErrClosed) {
				// It was ending already (the host disconnected, or its
				// keep-alive expired): its session let go of the volume,
				// and the last session to let go flushes and closes the
				// handle (target.FrontendSession.End).
				continue
			}
			errs = append(errs, fmt.Errorf("nvmf: shutdown: flushing %s: %w", c.subNQN, err))
		}
	}
	var wg sync.WaitGroup
	for _, c := range ctrls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.end("target shutdown")
		}()
	}
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.end("target shutdown")
		}()
	}
	wg.Wait()
	s.accepted.Wait()
	return errors.Join(errs...)
}

// getBuf, tryGetBuf and putBuf take and give back data buffers of n bytes
// (at most 1 MiB), counted in bufsOut.
func (s *Server) getBuf(ctx context.Context, n int) ([]byte, error) {
	b, err := s.bufs.Get(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("nvmf: data buffer: %w", err)
	}
	s.bufsOut.Add(1)
	return b[:n], nil
}

func (s *Server) tryGetBuf(n int) []byte {
	b := s.bufs.TryGet(n)
	if b == nil {
		return nil
	}
	s.bufsOut.Add(1)
	return b[:n]
}

func (s *Server) putBuf(b []byte) {
	if b != nil {
		s.bufsOut.Add(-1)
		s.bufs.Put(b)
	}
}
