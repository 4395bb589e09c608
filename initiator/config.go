package initiator

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// DefaultInlineRead is Config.InlineRead's default.
const DefaultInlineRead = blockproto.MaxInline

// Config configures a Client.
type Config struct {
	// Addr is the target, "host:port"; for a volume several gateways
	// serve (one at a time, as rtarget in front of Ceph RBD), a comma-
	// separated list: the client logs in to the first that accepts and,
	// when its session is lost, moves on to the next (see Failover in the
	// package documentation).
	Addr      string
	Volume    string
	Initiator string // this initiator's name
	Secret    []byte // pre-shared with the target

	// Device is the RNIC to use; nil opens one the Client owns.
	Device *rnic.Device
	Logger *slog.Logger

	QPs        int // QPs per session: 2
	QueueDepth int // credits asked for per QP: 32
	ORD        int // outstanding RDMA Reads and atomics per QP: 16
	// InlineRead is the largest read asked for inline: the target answers
	// it with the data in its Send (DATA) instead of advertising a buffer
	// to RDMA-Read, if it offers inline reads. 16 KiB, the protocol's
	// most (a multiple of 512); negative: none. At QD1 an inline 16 KiB
	// read takes about two thirds of the time of one through READY, RDMA
	// Read and RELEASE (BenchmarkReadInline); each receive buffer of a QP
	// is then 16 KiB + 32 bytes.
	InlineRead int

	LoginTimeout time.Duration // per QP login: 10 s
	// Reconnect backoff: starts at ReconnectMin, doubles to ReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
	// NoReconnect makes a lost session fail the requests in flight
	// instead of reconnecting and replaying them.
	NoReconnect bool

	// Heartbeat: every HeartbeatInterval the client reads the lock table's
	// reservation word with an RDMA atomic, which the target's RNIC
	// answers without touching its store. A session whose heartbeat is not
	// answered within HeartbeatTimeout is lost (the target is stopped or
	// cut off: its TCP connection may stay up for minutes), so the client
	// reconnects, to the next target of Addr if there are several.
	// Defaults 2 s and 15 s; a negative interval disables it.
	HeartbeatInterval, HeartbeatTimeout time.Duration

	addrs []string // Addr split
}

func (c *Config) fill() error {
	if !blockproto.ValidName(c.Initiator) || !blockproto.ValidName(c.Volume) {
		return fmt.Errorf("%w: initiator and volume names must be 1-%d bytes of printable UTF-8", ErrInvalid, blockproto.MaxName)
	}
	if len(c.Secret) == 0 {
		return fmt.Errorf("%w: no secret", ErrAuth)
	}
	c.addrs = nil
	for _, a := range strings.Split(c.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.addrs = append(c.addrs, a)
		}
	}
	if len(c.addrs) == 0 {
		return fmt.Errorf("%w: no target address", ErrInvalid)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.QPs, 2)
	def(&c.QueueDepth, 32)
	def(&c.ORD, 16)
	if c.InlineRead == 0 {
		c.InlineRead = DefaultInlineRead
	}
	if c.InlineRead > blockproto.MaxInline || c.InlineRead > 0 && c.InlineRead%minIO != 0 {
		return fmt.Errorf("%w: InlineRead %d must be a multiple of %d up to %d", ErrInvalid, c.InlineRead, minIO, blockproto.MaxInline)
	}
	if c.QueueDepth > 1<<15 {
		c.QueueDepth = 1 << 15
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = 10 * time.Second
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 50 * time.Millisecond
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 2 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 15 * time.Second
	}
	return nil
}
