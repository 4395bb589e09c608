package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// Client is a logged-in connection to one volume of a target: a session
// of several QPs, re-established (and its unanswered requests replayed)
// when it is lost. All methods are safe for concurrent use.
type Client struct {
	cfg    Config
	log    *slog.Logger
	dev    *rnic.Device
	ownDev bool

	// size is the volume's size as the latest login gave it: a volume
	// grown (or shrunk) while the client was away shows its new size
	// from the next session on (Size).
	size     atomic.Int64
	readOnly bool

	// barrier orders Flush after the writes issued before it: writes hold
	// it shared for their whole duration (retries included), Flush
	// exclusively.
	barrier sync.RWMutex
	// unflushed is the boot ID of the target that acknowledged the oldest
	// write not yet covered by a flush (0: none).
	unflushed atomic.Uint64
	// losses counts the Flushes that returned ErrWritesLost (WriteLosses).
	losses atomic.Uint64
	// fence is the token WriteAt, Trim and WriteZeroes carry (0: none).
	fence   atomic.Uint64
	lockSeq atomic.Uint64
	// noInline: the target refused a LOGIN asking for inline reads (it
	// predates them); later logins do not ask.
	noInline atomic.Bool
	// noExtents: the target refused a LOGIN asking for BLOCK_STATUS.
	noExtents atomic.Bool
	// noNoHole: the target refused a LOGIN asking for WRITE_ZEROES with
	// FlagNoHole.
	noNoHole atomic.Bool

	mu        sync.Mutex
	target    int      // index in cfg.addrs of the target to dial next
	sess      *session // nil while reconnecting
	epoch     uint64
	changed   chan struct{} // closed and replaced whenever sess changes (and by wake)
	fatal     error         // why the client gave up for good (giveUpLocked): every request fails with it
	gaveUp    chan struct{} // closed when fatal is set
	closed    bool
	reconnect bool // a reconnect loop runs
	wg        sync.WaitGroup

	// dialed, when a test sets it, is called with each session dial
	// logged in, before the session is adopted.
	dialed func(*session)
}

// Connect logs in to cfg.Volume at cfg.Addr (the first of its targets that
// accepts the login).
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger.With("volume", cfg.Volume, "target", cfg.Addr), dev: cfg.Device,
		changed: make(chan struct{}), gaveUp: make(chan struct{})}
	if c.dev == nil {
		d, err := rnic.Open(rnic.Config{Name: "initiator", Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("initiator: open RNIC: %w", err)
		}
		c.dev, c.ownDev = d, true
	}
	c.epoch = 1
	var s *session
	var errs []error
	target := 0
	for i, addr := range cfg.addrs {
		var err error
		if s, err = c.dial(ctx, c.epoch, addr); err == nil {
			target = i
			break
		}
		errs = append(errs, err)
		if len(cfg.addrs) > 1 {
			c.log.Warn("login failed; trying the next target", "addr", addr, "err", err)
		}
	}
	if s == nil {
		if c.ownDev {
			c.dev.Close()
		}
		return nil, errors.Join(errs...)
	}
	c.size.Store(s.size)
	c.readOnly = s.readOnly
	c.mu.Lock()
	c.target = target
	died := c.adopt(s)
	c.mu.Unlock()
	c.log.Info("logged in", "session", s.id, "slot", s.slot, "qps", len(s.qps), "size", s.size)
	if died {
		c.lost(s)
	}
	return c, nil
}

// adopt makes s, a session just logged in (its QPs already running), the
// client's session; c.mu is held. It reports whether s had died already:
// its fail then called lost while another session (or none) was in
// place, and lost left it alone, so the caller calls lost(s) again once
// c.mu is released, which now finds s in place and reconnects.
func (c *Client) adopt(s *session) (died bool) {
	c.sess = s
	return s.isDead()
}

// Size is the volume's size in bytes, as the latest login gave it: a
// volume resized while the session was down shows its new size once the
// client has logged in again (an NBD export reads it for each new
// connection).
func (c *Client) Size() int64 { return c.size.Load() }

// GaveUp is closed when the client gives up on the volume for good: the
// session was lost and every target of Config.Addr refused the login
// again for good, one after the other (a refusal no retry can change:
// authentication, an unknown volume, the protocol version or a protocol
// error), or the session was lost with NoReconnect set. Failures a retry
// may cure (a refused connection, a timeout, a target shutting down or
// busy) never make it give up: it reconnects with backoff for as long as
// it takes. From then on every request fails with Err. Close does not
// close GaveUp.
func (c *Client) GaveUp() <-chan struct{} { return c.gaveUp }

// Err is why the client gave up (see GaveUp), or nil.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fatal
}

// giveUpLocked makes err the outcome of every request from now on and
// closes GaveUp; c.mu is held.
func (c *Client) giveUpLocked(err error) {
	if c.fatal != nil {
		return
	}
	c.fatal = err
	close(c.gaveUp)
}

// ReadOnly reports whether the target exports the volume read-only.
func (c *Client) ReadOnly() bool { return c.readOnly }

// Close ends the session. Requests in flight fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	c.signalLocked()
	c.mu.Unlock()
	if s != nil {
		s.close()
	}
	c.wg.Wait()
	if c.ownDev {
		c.dev.Close()
	}
	return nil
}

// current waits for a live session.
func (c *Client) current(ctx context.Context) (*session, error) {
	return c.currentUnless(ctx, nil)
}

// currentUnless is current that returns errCovered when stop (if not
// nil) reports true while there is no live session.
func (c *Client) currentUnless(ctx context.Context, stop func() bool) (*session, error) {
	for {
		c.mu.Lock()
		s, ch, fatal, closed := c.sess, c.changed, c.fatal, c.closed
		c.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case fatal != nil:
			return nil, fatal
		case s != nil && !s.isDead():
			return s, nil
		case stop != nil && stop():
			return nil, errCovered
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("initiator: waiting for the session: %w", ctx.Err())
		}
	}
}

// lost is called when session s died: the client reconnects (once per
// loss) unless it is closed or NoReconnect is set.
func (c *Client) lost(s *session) {
	c.mu.Lock()
	if c.sess != s {
		c.mu.Unlock()
		go s.close()
		return
	}
	c.sess = nil
	c.signalLocked()
	start := !c.closed && !c.reconnect
	if len(c.cfg.addrs) > 1 && c.cfg.addrs[c.target] == s.addr {
		// Gateways: the one that just failed is the least likely to
		// answer; try the next first.
		c.target = (c.target + 1) % len(c.cfg.addrs)
	}
	if c.cfg.NoReconnect && !c.closed {
		c.giveUpLocked(fmt.Errorf("initiator: session lost (reconnect disabled): %w", s.cause))
		start = false
	}
	if start {
		c.reconnect = true
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if s.leaving.Load() {
		// The target said goodbye (a shutdown or restart): expected.
		c.log.Info("session closed by the target", "session", s.id, "cause", s.cause)
	} else {
		c.log.Warn("session lost", "session", s.id, "cause", s.cause)
	}
	go s.close()
	if start {
		go c.reconnectLoop()
	}
}

// reconnectLoop logs in again with exponential backoff.
func (c *Client) reconnectLoop() {
	defer c.wg.Done()
	wait := c.cfg.ReconnectMin
	// permanents counts consecutive targets that refused the login for
	// good; the client gives up when all of them did.
	permanents := 0
	for {
		c.mu.Lock()
		closed := c.closed
		c.epoch++
		epoch := c.epoch
		addr := c.cfg.addrs[c.target]
		c.mu.Unlock()
		if closed {
			break
		}
		ctx, cancel := context.WithCancel(context.Background())
		stop := c.onClose(cancel)
		s, err := c.dial(ctx, epoch, addr)
		stop()
		cancel()
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				s.close()
				break
			}
			if s.bootID != 0 && c.unflushed.Load() != 0 && c.unflushed.Load() != s.bootID {
				c.log.Warn("the target restarted since the last flush: the next Flush reports ErrWritesLost")
			}
			if old := c.size.Swap(s.size); old != s.size {
				c.log.Warn("the volume's size changed while the session was down; new connections see the new size",
					"old", old, "new", s.size)
			}
			died := c.adopt(s)
			c.reconnect = false
			c.signalLocked()
			c.mu.Unlock()
			c.log.Info("session re-established", "session", s.id, "slot", s.slot, "boot", s.bootID, "addr", addr)
			if died {
				c.lost(s)
			}
			return
		}
		if permanent(err) {
			permanents++
		} else {
			permanents = 0
		}
		if len(c.cfg.addrs) > 1 {
			c.mu.Lock()
			c.target = (c.target + 1) % len(c.cfg.addrs)
			c.mu.Unlock()
		}
		if permanents >= len(c.cfg.addrs) {
			c.mu.Lock()
			c.giveUpLocked(fmt.Errorf("initiator: cannot log in again: %w", err))
			c.reconnect = false
			c.signalLocked()
			c.mu.Unlock()
			c.log.Error("giving up reconnecting: every target refused the login for good", "addr", addr, "err", err)
			return
		}
		c.log.Info("reconnect failed; retrying", "in", wait, "addr", addr, "err", err)
		c.backoff(wait)
		wait = min(2*wait, c.cfg.ReconnectMax)
	}
	c.mu.Lock()
	c.reconnect = false
	c.mu.Unlock()
}

// backoff waits for d, or until the client is closed.
func (c *Client) backoff(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-c.closedCh():
			// Also closed when the session changes or by wake: only
			// Close ends the wait.
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if closed {
				return
			}
		}
	}
}

// closedCh returns a channel closed when the client is closed (or when the
// session changes; callers re-check).
func (c *Client) closedCh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// onClose calls f when Close runs (until the returned stop is called).
func (c *Client) onClose(f func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			ch := c.closedCh()
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if closed {
				f()
				return
			}
			select {
			case <-ch:
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}

// retry runs fn on the current session, again on the next one each time
// the session is lost underneath it (replay), until it succeeds, fails
// otherwise, or ctx ends. Once ctx has ended fn is not started again, even
// when a session is there: a request whose caller gave up (an NBD client
// that left) must not run later, over what may have been written since.
func (c *Client) retry(ctx context.Context, fn func(s *session) error) error {
	return c.retryUnless(ctx, nil, fn)
}

// errCovered is retryUnless's error when its stop condition held.
var errCovered = errors.New("initiator: no longer needed")

// retryUnless is retry that gives up with errCovered, instead of waiting
// for the next session, once stop (when not nil) reports true; stop is
// checked whenever the session or the unflushed writes change.
func (c *Client) retryUnless(ctx context.Context, stop func() bool, fn func(s *session) error) error {
	for {
		s, err := c.currentUnless(ctx, stop)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("initiator: not started: %w", err)
		}
		err = fn(s)
		if err == nil || !errors.Is(err, errConnLost) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.fail(err) // make sure the client knows
	}
}

// noteAck records an acknowledged write for ErrWritesLost (completion handler).
func (c *Client) noteAck(s *session, op blockproto.Opcode, flags uint16) {
	switch op {
	case blockproto.OpWrite, blockproto.OpWriteZeroes:
		if flags&blockproto.FlagFUA != 0 {
			return
		}
	case blockproto.OpTrim:
	default:
		return
	}
	c.unflushed.CompareAndSwap(0, s.bootID)
}

// wake wakes whoever waits in current for the session to change, to check
// again what they wait for.
func (c *Client) wake() {
	c.mu.Lock()
	c.signalLocked()
	c.mu.Unlock()
}

// signalLocked closes and replaces c.changed, waking whoever waits on it
// to look again; c.mu is held.
func (c *Client) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}
