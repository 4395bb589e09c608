package target

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// DefaultMaxInline is Config.MaxInline's default.
const DefaultMaxInline = blockproto.MaxInline

// SecretFunc returns the pre-shared secret of an initiator for a volume,
// or ok false if that initiator may not log in to it.
type SecretFunc func(initiator, volume string) (secret []byte, ok bool)

// StaticSecret lets every initiator log in to every volume with one
// secret.
func StaticSecret(secret []byte) SecretFunc {
	s := append([]byte(nil), secret...)
	return func(string, string) ([]byte, bool) { return s, len(s) > 0 }
}

// Config configures a Target. Zero limits take the defaults below.
type Config struct {
	Store  store.Store
	Device *rnic.Device
	Secret SecretFunc
	// ReadOnly, if set, says which volumes refuse writes.
	ReadOnly func(volume string) bool
	Logger   *slog.Logger
	Metrics  *Metrics // nil: the target allocates its own

	MaxCredits  int // most credits (queue depth) granted per QP: 64
	MaxTransfer int // largest READ/WRITE/WRITE_REQ in bytes: 1 MiB
	GrantSize   int // data capacity of a write grant: 64 KiB
	MaxGrants   int // write grants per QP: the QP's credits (at most this): 32
	// MaxInline is the largest READ answered inline (DATA) on a QP whose
	// initiator asks for inline reads: 16 KiB, the protocol's most (a
	// multiple of 512); negative: never (the WELCOME does not offer it).
	MaxInline int
	// LegacyLogin refuses a LOGIN with FlagInline as malformed, as targets
	// before inline reads did (for compatibility tests).
	LegacyLogin bool
	// LegacyNoHole refuses a LOGIN with FlagNoHole as malformed, as
	// targets before WRITE_ZEROES kept ranges allocated did (for
	// compatibility tests).
	LegacyNoHole bool
	BufferBytes  int64 // memory for grants, READ and WRITE_REQ buffers: 256 MiB

	MaxSessions      int // sessions at once: 256 (and 63 per volume)
	MaxQPsPerSession int // 8
	MaxLogins        int // logins in progress at once: 64
	Locks            uint32
	IRD              int // inbound RDMA Reads and atomics per QP: 32

	LoginTimeout time.Duration // a login must finish within it: 10 s
	ReadLease    time.Duration // a READ buffer not released by then is revoked: 30 s
}

func (c *Config) fill() error {
	if c.Store == nil || c.Device == nil || c.Secret == nil {
		return fmt.Errorf("target: Config needs Store, Device and Secret")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = new(Metrics)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxCredits, 64)
	def(&c.MaxTransfer, 1<<20)
	def(&c.GrantSize, 64<<10)
	def(&c.MaxGrants, 32)
	def(&c.MaxSessions, 256)
	def(&c.MaxQPsPerSession, 8)
	def(&c.MaxLogins, 64)
	def(&c.IRD, 32)
	if c.MaxInline == 0 {
		c.MaxInline = DefaultMaxInline
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = 256 << 20
	}
	if c.Locks == 0 {
		c.Locks = 1024
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = 10 * time.Second
	}
	if c.ReadLease <= 0 {
		c.ReadLease = 30 * time.Second
	}
	const blk = store.BlockSize
	if c.MaxTransfer%blk != 0 || c.GrantSize%blk != 0 || c.GrantSize > c.MaxTransfer {
		return fmt.Errorf("target: MaxTransfer %d and GrantSize %d must be multiples of %d, GrantSize <= MaxTransfer",
			c.MaxTransfer, c.GrantSize, blk)
	}
	if c.MaxInline > blockproto.MaxInline || c.MaxInline > 0 && c.MaxInline%minIO != 0 {
		return fmt.Errorf("target: MaxInline %d must be a multiple of %d up to %d", c.MaxInline, minIO, blockproto.MaxInline)
	}
	if c.MaxCredits > 1<<15 || c.Locks > 1<<20 {
		return fmt.Errorf("target: MaxCredits %d (max 32768) or Locks %d (max 1<<20) too large", c.MaxCredits, c.Locks)
	}
	if c.BufferBytes < int64(2*c.MaxTransfer+2*blk) {
		return fmt.Errorf("target: BufferBytes %d is below two maximum transfers", c.BufferBytes)
	}
	return nil
}
