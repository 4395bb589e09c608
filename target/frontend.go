package target

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/store"
)

// A second front end (NVMe/RDMA, package target/nvmf) serves the same
// volumes as the native protocol. It opens each volume through a
// FrontendSession: a session of this target without QPs, holding the
// volume open and a reservation slot in the volume's one lock table. Its
// writes pass the same reservation check as a native session's, and a
// reservation it takes binds native sessions, so a volume reserved on
// either side refuses writes from the other.

// Errors of FrontendSession.
var (
	// ErrReservationConflict: another session holds a reservation that
	// forbids this session's write, or the reservation it asked for.
	ErrReservationConflict = errors.New("target: reservation conflict")
	// ErrReadOnly: the volume refuses writes.
	ErrReadOnly = errors.New("target: volume is read-only")
	// ErrNoSlot: the volume has MaxSlot+1 sessions already.
	ErrNoSlot = errors.New("target: volume has no free session slot")
)

// FrontendSession is a front end's hold on one volume (see above).
type FrontendSession struct{ s *session }

// OpenFrontendSession opens volume for initiator (a name shown as the
// holder of its reservations, e.g. an NVMe host NQN). End releases it.
func (t *Target) OpenFrontendSession(ctx context.Context, volume, initiator string) (*FrontendSession, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	vol, err := t.openVolume(ctx, volume)
	if err != nil {
		return nil, err
	}
	s := &session{t: t, name: initiator, vol: vol}
	if !vol.takeSlot(s) {
		t.releaseVolume(vol)
		return nil, fmt.Errorf("%w: %s", ErrNoSlot, volume)
	}
	if !t.addSession(s) {
		vol.releaseSlot(s.slot)
		t.releaseVolume(vol)
		return nil, ErrClosed
	}
	t.log.Info("front-end session opened", "session", s.id, "initiator", initiator, "volume", volume, "slot", s.slot)
	return &FrontendSession{s: s}, nil
}

// Volume is the store handle (shared with the target's other sessions;
// the caller must not close it).
func (f *FrontendSession) Volume() store.Volume { return f.s.vol.v }

// Info describes the volume.
func (f *FrontendSession) Info() store.VolumeInfo { return f.s.vol.info }

// ReadOnly reports whether the volume refuses writes.
func (f *FrontendSession) ReadOnly() bool { return f.s.vol.readOnly }

// Mutate runs fn (a write, trim or write-zeroes to the store) if this
// session may change the volume now: not read-only, and no reservation of
// another session forbids it. Otherwise fn does not run and the error
// wraps ErrReadOnly or ErrReservationConflict (naming the holder). The
// check and fn run under the volume's fence, as a native write does, so a
// reservation taken meanwhile orders after fn. An fn failing with
// store.ErrFenced ends every session of the volume (see storeFailed).
func (f *FrontendSession) Mutate(fn func() error) error {
	vol := f.s.vol
	vol.fence.RLock()
	defer vol.fence.RUnlock()
	c := vol.checkMutation(f.s.slot, 0)
	switch c.status {
	case blockproto.StatusOK:
		err := fn()
		// A volume another target took over (store.ErrFenced) is
		// dropped here as for a native session: every session on it
		// ends, this one included.
		f.s.t.storeFailed(vol, err)
		return err
	case blockproto.StatusReadOnly:
		return fmt.Errorf("%w: %s", ErrReadOnly, vol.name)
	default:
		f.s.t.m.ReservedFails.Add(1)
		return fmt.Errorf("%w: volume %s reserved by %q", ErrReservationConflict, vol.name, c.detail)
	}
}

// LockBlocks takes the volume's block stripes of blocks [first,
// first+count) for a whole-block change, shared, as a native whole-block
// write does: a native write of part of a block reads, modifies and
// writes the block back under its stripe held exclusively, and a
// whole-block write that ran meanwhile would be overwritten with what
// that read found. Call it inside Mutate's fn (after the volume's fence,
// the native order); the returned function unlocks.
func (f *FrontendSession) LockBlocks(first, count uint64) (unlock func()) {
	r := f.s.vol.lockBlocks(first, count, false, false)
	return r.unlock
}

// Reserve takes the volume's exclusive reservation for this session (as a
// native initiator's Compare-and-Swap on the reservation word does): it
// succeeds if the reservation is free or already this session's; any
// other holder gives ErrReservationConflict.
func (f *FrontendSession) Reserve() error {
	vol, slot := f.s.vol, f.s.slot
	w := &vol.words[blockproto.WordReservation]
	want := uint64(blockproto.Exclusive(slot))
	for {
		old := atomic.LoadUint64(w)
		if old == want {
			return nil
		}
		if old != 0 {
			return fmt.Errorf("%w: volume %s reserved by %q", ErrReservationConflict, vol.name, f.holderName(old))
		}
		if atomic.CompareAndSwapUint64(w, 0, want) {
			return nil
		}
	}
}

// Unreserve drops this session's reservation, if it holds one; it reports
// whether it did.
func (f *FrontendSession) Unreserve() bool {
	vol, slot := f.s.vol, f.s.slot
	w := &vol.words[blockproto.WordReservation]
	for {
		old := atomic.LoadUint64(w)
		r := blockproto.Reservation(old)
		if !r.Holds(slot) {
			return false
		}
		if atomic.CompareAndSwapUint64(w, old, uint64(r.Without(slot))) {
			return true
		}
	}
}

// Reservation describes the volume's reservation now: whether anybody
// holds one, whether it is exclusive, whether this session is a holder,
// and the first holder's name.
func (f *FrontendSession) Reservation() (held, exclusive, mine bool, holder string) {
	r := blockproto.Reservation(atomic.LoadUint64(&f.s.vol.words[blockproto.WordReservation]))
	if r.Free() {
		return false, false, false, ""
	}
	return true, r.IsExclusive(), r.Holds(f.s.slot), f.holderName(uint64(r))
}

func (f *FrontendSession) holderName(w uint64) string {
	if h, ok := blockproto.Reservation(w).FirstHolder(); ok {
		if s := f.s.vol.holder(h); s != nil {
			return s.name
		}
	}
	return ""
}

// End releases the session: its reservation (raising the fence floor),
// its slot and its reference on the volume (the last one flushes and
// closes the store handle).
func (f *FrontendSession) End(reason string) { f.s.end(reason) }
