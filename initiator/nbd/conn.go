package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/internal/sockio"
)

// conn is one client connection.
type conn struct {
	cfg      *config
	nc       net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	log      *slog.Logger
	noZeroes bool // the client set NBD_FLAG_C_NO_ZEROES
	// Negotiated by options: structured replies, and the export
	// base:allocation was last selected (or not) for.
	structured bool
	metaExport string
	metaAlloc  bool

	mu      sync.Mutex // guards closing and the read deadline
	closing bool
	pool    *bufPool
}

// ioBufSize is the size of the connection's read and write buffers.
const ioBufSize = 64 << 10

// serveConn runs the protocol on nc and closes it. Protocol violations
// are logged here, at Error level, so that every caller gets the log.
func (cfg *config) serveConn(ctx context.Context, nc net.Conn) error {
	c, err := cfg.run(ctx, nc)
	if errors.Is(err, ErrProtocol) {
		c.log.Error("nbd: closed connection on protocol violation", "err", err)
	}
	return err
}

func (cfg *config) run(ctx context.Context, nc net.Conn) (*conn, error) {
	defer nc.Close()
	c := &conn{
		cfg:  cfg,
		nc:   nc,
		br:   bufio.NewReaderSize(connReader(nc), ioBufSize),
		bw:   bufio.NewWriterSize(nc, ioBufSize),
		log:  cfg.log.With("remote", nc.RemoteAddr().String()),
		pool: &bufPool{},
	}
	// Cancellation unblocks whatever read is in progress; the phase that
	// is running then sees ctx.Err() and winds down.
	stop := context.AfterFunc(ctx, c.shutdown)
	defer stop()

	c.setReadDeadline(time.Now().Add(cfg.handshakeTimeout))
	if err := nc.SetWriteDeadline(time.Now().Add(cfg.handshakeTimeout)); err != nil {
		return c, fmt.Errorf("nbd: set deadline: %w", err)
	}
	sel, err := c.negotiate()
	switch {
	case errors.Is(err, errAborted):
		c.log.Debug("nbd: client ended the handshake")
		return c, nil
	case err != nil && ctx.Err() != nil:
		return c, nil
	case err != nil:
		return c, fmt.Errorf("handshake: %w", err)
	}
	c.setReadDeadline(time.Time{})
	if err := nc.SetWriteDeadline(time.Time{}); err != nil {
		return c, fmt.Errorf("nbd: clear deadline: %w", err)
	}
	c.log.Info("nbd: transmission", "export", sel.exp.Name, "size", sel.size,
		"flags", fmt.Sprintf("%#x", sel.flags), "via", optionName(sel.via), "block_size_requested", sel.blockSize,
		"structured_replies", sel.structured, "base_allocation", sel.metaAlloc)
	return c, c.transmit(ctx, sel)
}

// shutdown makes the reader stop: reads fail at once from now on.
func (c *conn) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	_ = c.nc.SetReadDeadline(time.Unix(1, 0))
}

// setReadDeadline sets the read deadline unless shutdown has begun.
func (c *conn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closing {
		_ = c.nc.SetReadDeadline(t)
	}
}

// connReader is what the request reader reads nc through: a sockio.Reader
// where nc allows it (no scheduler round trip per read, see package
// sockio), else nc itself.
func connReader(nc net.Conn) io.Reader {
	if r := sockio.NewReader(nc); r != nil {
		return r
	}
	return nc
}
