package nbd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Server serves Exports over NBD. Its fields must not change once Serve or
// ServeConn has been called; the methods are safe for concurrent use.
type Server struct {
	// Exports offered; names must be unique.
	Exports []Export
	// Logger receives connection and error logs; nil means slog.Default().
	Logger *slog.Logger
	// MaxInFlight bounds the requests of one connection being served at
	// once (read from the socket and not yet answered). Default 64.
	MaxInFlight int
	// MaxInFlightBytes bounds the payload bytes (WRITE data received,
	// READ data to send) of one connection's requests in flight. The
	// reader stops taking requests off the socket while the budget is
	// used up. Default 64 MiB; raised to the largest MaxBlock if smaller.
	MaxInFlightBytes int64
	// HandshakeTimeout bounds option haggling. Default 30 s.
	HandshakeTimeout time.Duration
	// DrainTimeout bounds how long a closing connection may take to send
	// the replies of requests still in flight (after NBD_CMD_DISC, a
	// protocol violation or shutdown). Default 10 s.
	DrainTimeout time.Duration
}

// Defaults of the Server's limits.
const (
	DefaultMaxInFlight      = 64
	DefaultMaxInFlightBytes = 64 << 20
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultDrainTimeout     = 10 * time.Second
)

// config is a Server's settings with defaults applied, checked once.
type config struct {
	exports          []Export
	log              *slog.Logger
	maxInFlight      int
	maxInFlightBytes int64
	handshakeTimeout time.Duration
	drainTimeout     time.Duration
}

func (s *Server) config() (*config, error) {
	c := &config{
		log:              s.Logger,
		maxInFlight:      s.MaxInFlight,
		maxInFlightBytes: s.MaxInFlightBytes,
		handshakeTimeout: s.HandshakeTimeout,
		drainTimeout:     s.DrainTimeout,
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.maxInFlight <= 0 {
		c.maxInFlight = DefaultMaxInFlight
	}
	if c.maxInFlightBytes <= 0 {
		c.maxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.handshakeTimeout <= 0 {
		c.handshakeTimeout = DefaultHandshakeTimeout
	}
	if c.drainTimeout <= 0 {
		c.drainTimeout = DefaultDrainTimeout
	}
	if len(s.Exports) == 0 {
		return nil, fmt.Errorf("%w: no exports", ErrConfig)
	}
	seen := make(map[string]bool, len(s.Exports))
	for _, e := range s.Exports {
		e = e.withDefaults()
		if err := e.validate(); err != nil {
			return nil, err
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("%w: export name %q used twice", ErrConfig, e.Name)
		}
		seen[e.Name] = true
		c.maxInFlightBytes = max(c.maxInFlightBytes, int64(e.MaxBlock))
		c.exports = append(c.exports, e)
	}
	return c, nil
}

// lookup finds the export a client asked for: an exact match, or for the
// empty name the first export.
func (c *config) lookup(name string) (Export, bool) {
	for _, e := range c.exports {
		if e.Name == name {
			return e, true
		}
	}
	if name == "" {
		return c.exports[0], true
	}
	return Export{}, false
}

// Serve accepts connections on l (TCP or unix) and serves each in its own
// goroutine until ctx is cancelled; then it closes l, shuts every
// connection down (see ServeConn), waits for them and returns nil. It
// returns early with an error if the configuration is invalid or Accept
// fails permanently.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	cfg, err := s.config()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()

	cfg.log.Info("nbd: serving", "addr", l.Addr().String(), "exports", len(cfg.exports))
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if retryableAccept(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				cfg.log.Warn("nbd: accept failed, retrying", "err", err, "backoff", backoff)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			return fmt.Errorf("nbd: accept on %s: %w", l.Addr(), err)
		}
		backoff = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cfg.serveConn(ctx, nc); err != nil && !errors.Is(err, ErrProtocol) {
				cfg.log.Warn("nbd: connection ended with error", "remote", nc.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// ServeConn runs the NBD protocol on one connection and closes it when
// done. It returns nil when the client ends the session properly
// (NBD_OPT_ABORT, NBD_CMD_DISC, or closing the connection between
// requests) and when ctx is cancelled; an error wrapping ErrProtocol when
// the client violated the protocol; another error when the connection
// failed. When ctx is cancelled the connection stops taking requests,
// the Backend calls in progress see a cancelled context, and their
// replies are sent (within DrainTimeout) before the connection closes.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) error {
	cfg, err := s.config()
	if err != nil {
		nc.Close()
		return err
	}
	return cfg.serveConn(ctx, nc)
}

// retryableAccept reports whether an Accept error is worth retrying:
// running out of file descriptors, a connection aborted before it was
// accepted, a timeout.
func retryableAccept(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS)
}
