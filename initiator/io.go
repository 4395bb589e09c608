package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
)

// minIO is the alignment of offsets and lengths (the protocol's).
const minIO = 512

// maxDiscard is the largest TRIM or WRITE_ZEROES sent as one command.
const maxDiscard = 1 << 30

// check validates a byte range against the volume.
func (c *Client) check(off, n int64) error {
	size := c.size.Load()
	switch {
	case off < 0 || n < 0 || off%minIO != 0 || n%minIO != 0:
		return fmt.Errorf("%w: offset %d and length %d must be non-negative multiples of %d", ErrInvalid, off, n, minIO)
	case off > size || n > size-off:
		return fmt.Errorf("%w: %d bytes at %d, volume size %d", ErrRange, n, off, size)
	}
	return nil
}

// ReadAt fills p with the bytes at off. off and len(p) are multiples of
// 512. A request larger than the target's maximum transfer is split, the
// pieces running concurrently.
func (c *Client) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := c.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil // the protocol has no READ of length 0
	}
	return c.retry(ctx, func(s *session) error {
		return s.chunks(ctx, len(p), s.maxTransfer, func(at, n int) error {
			_, err := s.do(ctx, blockproto.OpRead, 0, uint64(off)+uint64(at), uint32(n), 0, p[at:at+n])
			return err
		})
	})
}

// WriteAt writes p at off, with FUA durable before it returns. It carries
// the fence token set with SetFence.
func (c *Client) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	return c.WriteAtToken(ctx, p, off, fua, c.fence.Load())
}

// WriteAtToken is WriteAt with an explicit fencing token (0: unfenced).
func (c *Client) WriteAtToken(ctx context.Context, p []byte, off int64, fua bool, token uint64) error {
	if err := c.check(off, int64(len(p))); err != nil {
		return err
	}
	if c.readOnly {
		return fmt.Errorf("%w: %s", ErrReadOnly, c.cfg.Volume)
	}
	if len(p) == 0 {
		return nil // the protocol has no WRITE of length 0
	}
	var flags uint16
	if fua {
		flags = blockproto.FlagFUA
	}
	c.barrier.RLock()
	defer c.barrier.RUnlock()
	return c.retry(ctx, func(s *session) error {
		return s.chunks(ctx, len(p), s.maxTransfer, func(at, n int) error {
			_, err := s.do(ctx, blockproto.OpWrite, flags, uint64(off)+uint64(at), uint32(n), token, p[at:at+n])
			return err
		})
	})
}

// Unflushed reports whether writes the target acknowledged are not yet
// covered by a successful Flush (or a target shutdown that synced them):
// only then does a Flush have anything to make durable.
func (c *Client) Unflushed() bool { return c.unflushed.Load() != 0 }

// Flush makes every write that completed before Flush was called durable.
// It waits for the writes in flight when it is called, so after a
// reconnect it covers the writes replayed on the new session. It returns
// ErrWritesLost if the target restarted, without a clean shutdown, after
// acknowledging writes that no flush covered. While there is no session,
// it returns nil as soon as no acknowledged write awaits a flush (a clean
// shutdown's GOODBYEs cover them).
func (c *Client) Flush(ctx context.Context) error {
	c.barrier.Lock()
	defer c.barrier.Unlock()
	first := c.unflushed.Load()
	// With no session to send the FLUSH on, there may be nothing left
	// for it to do: a target that shuts down cleanly syncs before its
	// GOODBYEs, and once those of the session that acknowledged the
	// writes cleared unflushed (before this Flush or while it waits),
	// every write that completed is durable. Waiting for a target that
	// is gone would only fail the Flush then. With a session, the FLUSH
	// is sent whatever unflushed says.
	covered := func() bool { return c.unflushed.Load() == 0 }
	var boot uint64
	err := c.retryUnless(ctx, covered, func(s *session) error {
		_, err := s.do(ctx, blockproto.OpFlush, 0, 0, 0, 0, nil)
		boot = s.bootID
		return err
	})
	switch {
	case errors.Is(err, errCovered):
		if first != 0 {
			c.log.Info("flush: the target synced the writes as it shut down")
		}
		return nil
	case err != nil:
		return err
	}
	c.unflushed.Store(0)
	if first != 0 && first != boot {
		c.losses.Add(1)
		return ErrWritesLost
	}
	return nil
}

// WriteLosses counts the Flushes that returned ErrWritesLost. Each loss is
// reported to one Flush only, the first after it; a caller that serves
// several clients (the NBD server, one per connection) compares the count
// with what it was when a client's writes were acknowledged, to tell that
// client too.
func (c *Client) WriteLosses() uint64 { return c.losses.Load() }

// Trim discards the whole 4096-byte blocks inside the range (they read as
// zeros afterwards; partial blocks at the ends keep their data).
func (c *Client) Trim(ctx context.Context, off, length int64) error {
	return c.discard(ctx, blockproto.OpTrim, off, length, false, false)
}

// WriteZeroes makes the range read as zeros, durably before it returns
// with fua.
func (c *Client) WriteZeroes(ctx context.Context, off, length int64, fua bool) error {
	return c.discard(ctx, blockproto.OpWriteZeroes, off, length, fua, false)
}

// WriteZeroesAllocated makes the range read as zeros and keeps it
// allocated in the target's store (NBD's NBD_CMD_FLAG_NO_HOLE): a later
// write there does not fail for lack of space. On a session whose target
// honours WRITE_ZEROES with FlagNoHole the target zeroes the range; one
// that predates it gets zeros written with WRITE, which every store
// allocates. Durable before it returns with fua.
func (c *Client) WriteZeroesAllocated(ctx context.Context, off, length int64, fua bool) error {
	return c.discard(ctx, blockproto.OpWriteZeroes, off, length, fua, true)
}

func (c *Client) discard(ctx context.Context, op blockproto.Opcode, off, length int64, fua, noHole bool) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	if c.readOnly {
		return fmt.Errorf("%w: %s", ErrReadOnly, c.cfg.Volume)
	}
	if length == 0 {
		return nil
	}
	var flags uint16
	if fua && op == blockproto.OpWriteZeroes {
		flags = blockproto.FlagFUA
	}
	token := c.fence.Load()
	c.barrier.RLock()
	defer c.barrier.RUnlock()
	return c.retry(ctx, func(s *session) error {
		flags := flags
		if noHole {
			if !s.noHole {
				return s.writeZeros(ctx, off, length, fua, token)
			}
			flags |= blockproto.FlagNoHole
		}
		for at := int64(0); at < length; at += maxDiscard {
			n := min(length-at, maxDiscard)
			if _, err := s.do(ctx, op, flags, uint64(off+at), uint32(n), token, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// zeroSource is the data of the WRITEs of writeZeros: zeros, shared by
// every request, which only reads it (the RNIC reads a WRITE's buffer,
// never writes it).
var zeroSource = make([]byte, 1<<20)

// zeroWindow is how much of a range writeZeros writes at once, in
// concurrent pieces of at most the maximum transfer.
const zeroWindow = 32 << 20

// writeZeros writes zeros over length bytes at off with WRITEs (FUA with
// fua, each piece durable before it is acknowledged): how a range is kept
// allocated on a target that does not honour FlagNoHole, since every
// store allocates written data.
func (s *session) writeZeros(ctx context.Context, off, length int64, fua bool, token uint64) error {
	var flags uint16
	if fua {
		flags = blockproto.FlagFUA
	}
	piece := min(s.maxTransfer, len(zeroSource))
	for at := int64(0); at < length; at += zeroWindow {
		base := uint64(off + at)
		err := s.chunks(ctx, int(min(length-at, zeroWindow)), piece, func(a, n int) error {
			_, err := s.do(ctx, blockproto.OpWrite, flags, base+uint64(a), uint32(n), token, zeroSource[:n])
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// chunks runs f over [0, total) in pieces of at most max bytes; pieces run
// concurrently and the first error wins.
func (s *session) chunks(ctx context.Context, total, max int, f func(at, n int) error) error {
	if total <= max {
		return f(0, total)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for at := 0; at < total; at += max {
		n := min(total-at, max)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(at, n); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// SetFence sets the fencing token that WriteAt, Trim and WriteZeroes
// carry from now on (0: none). Draw tokens with Token or with a Lock.
func (c *Client) SetFence(token uint64) { c.fence.Store(token) }

// run starts the exchange set up in the slot's fields and waits for its
// end; the slot is free again when it returns. When ctx ends first, an
// exchange that has not mapped the caller's memory is abandoned (the
// handler cleans up after it); one that has is waited for, for
// abandonGrace at most, after which the QP is reset: once it is stopped
// the RNIC no longer reaches the memory, and the session is replaced.
func (sl *slot) run(ctx context.Context) (result, error) {
	if err := sl.start(); err != nil {
		return result{}, err
	}
	select {
	case <-sl.done:
	case <-ctx.Done():
		if sl.state.CompareAndSwap(slotInflight, slotAbandoned) {
			return result{}, ctx.Err()
		}
		t := time.NewTimer(abandonGrace)
		select {
		case <-sl.done:
			t.Stop()
		case <-t.C:
			sl.q.die(fmt.Errorf("%w: a cancelled request's data was still moving after %v", errConnLost, abandonGrace))
			<-sl.done // failed once the QP stopped
		}
	}
	res, err := sl.collect()
	sl.p = nil
	sl.state.Store(slotIdle)
	sl.q.free <- sl.idx
	if err != nil && ctx.Err() != nil && errors.Is(err, errConnLost) {
		err = ctx.Err()
	}
	return res, err
}

// abandonGrace bounds the wait for the data transfer of a request whose
// context ended.
const abandonGrace = 2 * time.Second

// maxBlockStatus is the largest range one BLOCK_STATUS asks about (its
// length field is 32 bits).
const maxBlockStatus = 1<<32 - 4096

// BlockStatus reports the allocation of length bytes at off (multiples of
// 512), in order, as consecutive runs: fn gets each run's length and
// whether it is a hole (not allocated in the target's store: it reads as
// zeros); fn returns false to stop. A target that does not answer
// BLOCK_STATUS makes the whole range one run of data.
func (c *Client) BlockStatus(ctx context.Context, off, length int64, fn func(n int64, hole bool) bool) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	var buf [blockproto.MaxExtents * blockproto.ExtentLen]byte
	for length > 0 {
		var got []blockproto.ExtentFields
		err := c.retry(ctx, func(s *session) error {
			got = got[:0]
			if !s.pick(0).extents {
				got = append(got, blockproto.ExtentFields{Length: uint32(min(length, maxBlockStatus))})
				return nil
			}
			res, err := s.do(ctx, blockproto.OpBlockStatus, 0, uint64(off), uint32(min(length, maxBlockStatus)), 0, buf[:])
			if err != nil {
				return err
			}
			for i := range int(res.value) {
				d := buf[i*blockproto.ExtentLen:]
				got = append(got, blockproto.ExtentFields{Length: binary.BigEndian.Uint32(d[0:4]), Flags: binary.BigEndian.Uint32(d[4:8])})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, e := range got {
			n := int64(e.Length)
			if !fn(n, e.Flags&blockproto.ExtentHole != 0) {
				return nil
			}
			off, length = off+n, length-n
		}
	}
	return nil
}
