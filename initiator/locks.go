package initiator

import (
	"context"
	"fmt"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// Lock is a numbered lock held by this client's session.
type Lock struct {
	c     *Client
	s     *session
	n     uint32
	value uint64
	token uint64
}

// Number is the lock's number.
func (l *Lock) Number() uint32 { return l.n }

// Token is the fencing token drawn right after the lock was taken.
func (l *Lock) Token() uint64 { return l.token }

// Token draws a fresh fencing token (Fetch-and-Add on the generation
// word).
func (c *Client) Token(ctx context.Context) (uint64, error) {
	var tok uint64
	err := c.retry(ctx, func(s *session) error {
		g, err := s.atomic(ctx, rnic.WRFetchAdd, blockproto.WordOffset(blockproto.WordGeneration), 0, 1)
		tok = g + 1
		return err
	})
	return tok, err
}

// TryLock takes numbered lock n if it is free; otherwise it fails with a
// *LockedError naming the holder. A session without a reservation slot
// cannot hold one (ErrNoSlot).
func (c *Client) TryLock(ctx context.Context, n uint32) (*Lock, error) {
	var l *Lock
	err := c.retry(ctx, func(s *session) error {
		if n >= s.lockCount {
			return fmt.Errorf("%w: lock %d, the volume has %d", ErrInvalid, n, s.lockCount)
		}
		if s.slot > blockproto.MaxSlot {
			// A lock word names its holder by slot: without one it would
			// name nobody, read as free and never be cleared by the target.
			return ErrNoSlot
		}
		v := blockproto.LockValue(s.slot, c.lockSeq.Add(1))
		old, err := s.atomic(ctx, rnic.WRCmpSwap, blockproto.LockOffset(n), 0, v)
		if err != nil {
			return err
		}
		if old != 0 {
			h, _ := blockproto.LockHolder(old)
			name, err := s.holderName(ctx, h)
			if err != nil {
				return err
			}
			return &LockedError{Lock: n, Holder: name}
		}
		g, err := s.atomic(ctx, rnic.WRFetchAdd, blockproto.WordOffset(blockproto.WordGeneration), 0, 1)
		if err != nil {
			return err
		}
		l = &Lock{c: c, s: s, n: n, value: v, token: g + 1}
		return nil
	})
	return l, err
}

// Lock takes numbered lock n, waiting (polling with backoff) while another
// session holds it, until ctx ends.
func (c *Client) Lock(ctx context.Context, n uint32) (*Lock, error) {
	wait := 20 * time.Microsecond
	var refused error // the last refusal
	for {
		l, err := c.TryLock(ctx, n)
		if err == nil {
			return l, nil
		}
		if !isLocked(err) {
			if ctx.Err() != nil && refused != nil { // gave up during a try
				return nil, fmt.Errorf("initiator: waiting for lock %d: %w (last: %w)", n, ctx.Err(), refused)
			}
			return nil, err
		}
		refused = err
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, fmt.Errorf("initiator: waiting for lock %d: %w (last: %w)", n, ctx.Err(), err)
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

func isLocked(err error) bool {
	_, ok := err.(*LockedError)
	return ok
}

// Unlock releases the lock. It fails with ErrLockLost if the session that
// took it ended (the target then released it).
func (l *Lock) Unlock(ctx context.Context) error {
	s, err := l.c.current(ctx)
	if err != nil {
		return err
	}
	if s != l.s {
		return fmt.Errorf("%w: lock %d", ErrLockLost, l.n)
	}
	old, err := s.atomic(ctx, rnic.WRCmpSwap, blockproto.LockOffset(l.n), l.value, 0)
	if err != nil {
		return fmt.Errorf("%w: lock %d: %w", ErrLockLost, l.n, err)
	}
	if old != l.value {
		return fmt.Errorf("%w: lock %d holds %#x", ErrLockLost, l.n, old)
	}
	return nil
}

// Reservation is a volume reservation held by this client's session.
type Reservation struct {
	c         *Client
	s         *session
	exclusive bool
}

// Reserve takes the volume reservation: exclusive (only this session may
// write) or shared (nobody may write). If another session holds a
// conflicting one it fails with a *ReservedError naming the holder.
func (c *Client) Reserve(ctx context.Context, exclusive bool) (*Reservation, error) {
	var r *Reservation
	err := c.retry(ctx, func(s *session) error {
		if s.slot > blockproto.MaxSlot {
			return ErrNoSlot
		}
		off := blockproto.WordOffset(blockproto.WordReservation)
		bit := blockproto.SlotBit(s.slot)
		for {
			var want, old uint64
			var err error
			if exclusive {
				want = uint64(blockproto.Exclusive(s.slot))
				old, err = s.atomic(ctx, rnic.WRCmpSwap, off, 0, want)
				if err == nil && old == want {
					old = 0 // already ours
				}
			} else {
				var cur uint64
				if cur, err = s.atomic(ctx, rnic.WRFetchAdd, off, 0, 0); err != nil {
					return err
				}
				if blockproto.Reservation(cur).IsExclusive() {
					old = cur
				} else {
					if old, err = s.atomic(ctx, rnic.WRCmpSwap, off, cur, cur|bit); err == nil && old == cur {
						old = 0
					} else if err == nil {
						continue // raced with another sharer
					}
				}
			}
			if err != nil {
				return err
			}
			if old == 0 {
				r = &Reservation{c: c, s: s, exclusive: exclusive}
				return nil
			}
			return s.reservedError(ctx, old)
		}
	})
	return r, err
}

// reservedError names the holder of reservation word w.
func (s *session) reservedError(ctx context.Context, w uint64) error {
	r := blockproto.Reservation(w)
	e := &ReservedError{Exclusive: r.IsExclusive(), Word: w}
	if h, ok := r.FirstHolder(); ok {
		name, err := s.holderName(ctx, h)
		if err != nil {
			return err
		}
		e.Holder = name
	}
	return e
}

// Release gives the reservation back. It fails with ErrLockLost if the
// session that took it ended.
func (r *Reservation) Release(ctx context.Context) error {
	s, err := r.c.current(ctx)
	if err != nil {
		return err
	}
	if s != r.s {
		return fmt.Errorf("%w: reservation", ErrLockLost)
	}
	off := blockproto.WordOffset(blockproto.WordReservation)
	if r.exclusive {
		want := uint64(blockproto.Exclusive(s.slot))
		old, err := s.atomic(ctx, rnic.WRCmpSwap, off, want, 0)
		if err != nil {
			return fmt.Errorf("%w: reservation: %w", ErrLockLost, err)
		}
		if old != want {
			return fmt.Errorf("%w: reservation word %#x", ErrLockLost, old)
		}
		return nil
	}
	bit := blockproto.SlotBit(s.slot)
	for {
		cur, err := s.atomic(ctx, rnic.WRFetchAdd, off, 0, 0)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrLockLost, err)
		}
		if cur&bit == 0 || blockproto.Reservation(cur).IsExclusive() {
			return fmt.Errorf("%w: reservation word %#x", ErrLockLost, cur)
		}
		if old, err := s.atomic(ctx, rnic.WRCmpSwap, off, cur, cur&^bit); err != nil {
			return fmt.Errorf("%w: %w", ErrLockLost, err)
		} else if old == cur {
			return nil
		}
	}
}

// LockHolder reports who holds numbered lock n: the holder's initiator name
// and true, or "" and false if the lock is free. It reads the lock word with
// a Fetch-and-Add of zero, which changes nothing.
func (c *Client) LockHolder(ctx context.Context, n uint32) (string, bool, error) {
	var name string
	var held bool
	err := c.retry(ctx, func(s *session) error {
		if n >= s.lockCount {
			return fmt.Errorf("%w: lock %d, the volume has %d", ErrInvalid, n, s.lockCount)
		}
		w, err := s.atomic(ctx, rnic.WRFetchAdd, blockproto.LockOffset(n), 0, 0)
		if err != nil {
			return err
		}
		h, ok := blockproto.LockHolder(w)
		if !ok {
			name, held = "", false
			return nil
		}
		held = true
		name, err = s.holderName(ctx, h)
		return err
	})
	return name, held, err
}

// ReservationHolders reports the volume reservation: whether it is
// exclusive, and the initiator names of its holders (none: free).
func (c *Client) ReservationHolders(ctx context.Context) (exclusive bool, holders []string, err error) {
	err = c.retry(ctx, func(s *session) error {
		w, err := s.atomic(ctx, rnic.WRFetchAdd, blockproto.WordOffset(blockproto.WordReservation), 0, 0)
		if err != nil {
			return err
		}
		r := blockproto.Reservation(w)
		exclusive, holders = r.IsExclusive(), nil
		for slot := uint8(0); slot <= blockproto.MaxSlot; slot++ {
			if !r.Holds(slot) {
				continue
			}
			name, err := s.holderName(ctx, slot)
			if err != nil {
				return err
			}
			holders = append(holders, name)
		}
		return nil
	})
	return exclusive, holders, err
}
