package target

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/store"
)

// numStripes is the number of block-lock stripes per volume.
const numStripes = 1024

// volume is an exported volume: the store handle, the lock table and the
// sessions logged in to it. It lives while sessions use it.
type volume struct {
	name string
	v    store.Volume
	info store.VolumeInfo
	// size is the volume's size in bytes as of the latest login (a volume
	// grown while served shows its new size to sessions logging in).
	size     atomic.Int64
	readOnly bool
	refs     int // sessions (under Target.mu)

	// words is the lock table (blockproto layout); mem is the same memory
	// as bytes, registered for every session's QPs.
	words []uint64
	mem   []byte

	// fence orders mutating commands (read-locked around check and store
	// write) against session clean-up (write-locked); floor is the fence
	// floor F of the protocol, written under the write lock.
	fence sync.RWMutex
	floor uint64

	mu    sync.Mutex
	slots [blockproto.MaxSlot + 1]*session

	stripes [numStripes]sync.RWMutex

	// bootID is the WELCOME's boot ID for this volume: the target's, or
	// the store's DurableID for a volume of a shared store (store.Fencer).
	bootID uint64
	// fenced is set once the store reported the handle fenced; done is
	// closed when the last session released the volume and its handle is
	// closed (the store may find the fencing while it closes: a handle
	// taken over looks once more as it lets the volume go).
	fenced atomic.Bool
	done   chan struct{}
}

// epochShift places a store's fencing epoch above every generation one
// holder of the volume can reach (2^40 tokens per epoch).
const epochShift = 40

func newVolume(name string, v store.Volume, readOnly bool, locks uint32, bootID uint64) *volume {
	words := make([]uint64, blockproto.LockTableLen(locks)/8)
	vol := &volume{name: name, v: v, info: v.Info(), readOnly: readOnly || v.Info().ReadOnly, words: words,
		mem: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8), bootID: bootID, done: make(chan struct{})}
	vol.size.Store(vol.info.Size)
	// Tokens of an earlier incarnation of the target (or of this volume
	// state) are below the wall clock, so they start out stale.
	g := uint64(time.Now().UnixNano())
	if f, ok := v.(store.Fencer); ok {
		// A volume several targets serve in turn: the generation starts
		// at the epoch this target raised when it took the volume over,
		// so every token drawn at an earlier holder (a lower epoch) is
		// below the floor, whatever the targets' clocks say.
		g = f.FencingEpoch() << epochShift
		if id := f.DurableID(); id != 0 {
			vol.bootID = id
		}
	}
	atomic.StoreUint64(&words[blockproto.WordGeneration], g)
	vol.floor = g
	return vol
}

// takeSlot assigns a free reservation slot to s.
func (vol *volume) takeSlot(s *session) bool {
	vol.mu.Lock()
	defer vol.mu.Unlock()
	for i := range vol.slots {
		if vol.slots[i] == nil {
			vol.slots[i] = s
			s.slot = uint8(i)
			return true
		}
	}
	return false
}

// holder returns the session in slot i (nil if none).
func (vol *volume) holder(i uint8) *session {
	if i > blockproto.MaxSlot {
		return nil
	}
	vol.mu.Lock()
	defer vol.mu.Unlock()
	return vol.slots[i]
}

// releaseSlot clears slot i from the reservation word and every numbered
// lock it holds, raising the generation (and with it the fence floor) if
// the slot held anything, and frees the slot. It returns how many locks and
// reservations it cleared. Its session has ended (its QPs are down), so
// the slot takes nothing new meanwhile.
//
// The floor rises before the words are cleared. Other sessions take a lock
// or the reservation with RDMA atomics that the RNIC runs without the
// target's locks, a Compare-and-Swap of the word and then a Fetch-and-Add
// of the generation for their token; raised after the clearing, the floor
// could pass the token of a session that took the lock in between, which
// was then stale from its first write.
func (vol *volume) releaseSlot(i uint8) int {
	vol.fence.Lock()
	rw := &vol.words[blockproto.WordReservation]
	held := blockproto.Reservation(atomic.LoadUint64(rw)).Holds(i)
	for k := blockproto.FirstLockWord; k < len(vol.words) && !held; k++ {
		s, h := blockproto.LockHolder(atomic.LoadUint64(&vol.words[k]))
		held = h && s == i
	}
	if held {
		vol.floor = atomic.AddUint64(&vol.words[blockproto.WordGeneration], 1)
	}
	cleared := 0
	for {
		old := atomic.LoadUint64(rw)
		r := blockproto.Reservation(old)
		if !r.Holds(i) {
			break
		}
		if atomic.CompareAndSwapUint64(rw, old, uint64(r.Without(i))) {
			cleared++
			break
		}
	}
	for k := blockproto.FirstLockWord; k < len(vol.words); k++ {
		w := &vol.words[k]
		for {
			old := atomic.LoadUint64(w)
			if s, h := blockproto.LockHolder(old); !h || s != i {
				break
			}
			if atomic.CompareAndSwapUint64(w, old, 0) {
				cleared++
				break
			}
		}
	}
	vol.fence.Unlock()
	vol.mu.Lock()
	vol.slots[i] = nil
	vol.mu.Unlock()
	return cleared
}

// mutationCheck is the outcome of the reservation and fencing checks.
type mutationCheck struct {
	status blockproto.Status
	value  uint64
	detail string
	fenced bool // the store fenced the handle: answer nothing
}

// checkMutation applies the reservation and fencing rules for a command
// from slot with token. The caller holds vol.fence read-locked.
func (vol *volume) checkMutation(slot uint8, token uint64) mutationCheck {
	if vol.readOnly {
		return mutationCheck{status: blockproto.StatusReadOnly, detail: "volume " + vol.name + " is read-only"}
	}
	r := blockproto.Reservation(atomic.LoadUint64(&vol.words[blockproto.WordReservation]))
	if !r.WriteAllowed(slot) {
		c := mutationCheck{status: blockproto.StatusReserved, value: uint64(r)}
		if h, ok := r.FirstHolder(); ok {
			if s := vol.holder(h); s != nil {
				c.detail = s.name
			}
		}
		return c
	}
	if token != 0 {
		gen := atomic.LoadUint64(&vol.words[blockproto.WordGeneration])
		if blockproto.Stale(token, vol.floor, gen) {
			return mutationCheck{status: blockproto.StatusStaleToken, value: vol.floor,
				detail: fmt.Sprintf("token %d, fence floor %d", token, vol.floor)}
		}
	}
	return mutationCheck{}
}

// stripeRange locks the block stripes of blocks [first, first+count):
// exclusively the stripes of partial edge blocks (read-modify-write), shared
// the others, always in ascending stripe order.
type stripeRange struct {
	vol          *volume
	first, count uint64
	wFirst       int // stripe locked exclusively for a partial first block, or -1
	wLast        int // same for the last block
}

func (vol *volume) lockBlocks(first, count uint64, partialFirst, partialLast bool) stripeRange {
	r := stripeRange{vol: vol, first: first, count: count, wFirst: -1, wLast: -1}
	if count == 0 {
		return r
	}
	if partialFirst {
		r.wFirst = int(first % numStripes)
	}
	if partialLast {
		r.wLast = int((first + count - 1) % numStripes)
	}
	r.each(func(m *sync.RWMutex, excl bool) {
		if excl {
			m.Lock()
		} else {
			m.RLock()
		}
	})
	return r
}

// tryLockBlocks is lockBlocks for whole blocks (every stripe shared) for
// a caller that must not wait: it locks all the stripes or none.
func (vol *volume) tryLockBlocks(first, count uint64) (stripeRange, bool) {
	r := stripeRange{vol: vol, first: first, count: count, wFirst: -1, wLast: -1}
	if count == 0 {
		return r, true
	}
	ok, taken := true, 0
	r.each(func(m *sync.RWMutex, _ bool) {
		if ok = ok && m.TryRLock(); ok {
			taken++
		}
	})
	if !ok {
		i := 0
		r.each(func(m *sync.RWMutex, _ bool) {
			if i < taken {
				m.RUnlock()
			}
			i++
		})
		return stripeRange{}, false
	}
	return r, true
}

func (r stripeRange) unlock() {
	if r.count == 0 {
		return
	}
	r.each(func(m *sync.RWMutex, excl bool) {
		if excl {
			m.Unlock()
		} else {
			m.RUnlock()
		}
	})
}

// each visits the stripes of the range once each, in ascending order.
func (r stripeRange) each(f func(m *sync.RWMutex, excl bool)) {
	visit := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			f(&r.vol.stripes[i], i == r.wFirst || i == r.wLast)
		}
	}
	if r.count >= numStripes {
		visit(0, numStripes)
		return
	}
	a := int(r.first % numStripes)
	b := a + int(r.count)
	if b <= numStripes {
		visit(a, b)
		return
	}
	visit(0, b-numStripes)
	visit(a, numStripes)
}

// openVolume returns the exported volume name, opening it on first use.
func (t *Target) openVolume(ctx context.Context, name string) (*volume, error) {
	for {
		t.mu.Lock()
		if vol, ok := t.vols[name]; ok {
			vol.refs++
			t.mu.Unlock()
			return vol, nil
		}
		wait, busy := t.opening[name]
		if !busy {
			break // t.mu held
		}
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("target: open volume %q: %w", name, ctx.Err())
		}
	}
	// Opening may take a while (a shared store takes the volume over from
	// another target, or waits for an unreachable cluster up to its
	// timeout): t.mu is not held meanwhile; other logins to the volume
	// wait for this one.
	done := make(chan struct{})
	t.opening[name] = done
	t.mu.Unlock()
	v, err := t.cfg.Store.OpenVolume(ctx, name)
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.opening, name)
	close(done)
	if err != nil {
		return nil, fmt.Errorf("target: open volume %q: %w", name, err)
	}
	ro := t.cfg.ReadOnly != nil && t.cfg.ReadOnly(name)
	vol := newVolume(name, v, ro, t.cfg.Locks, t.bootID)
	vol.refs = 1
	t.vols[name] = vol
	if f, ok := v.(store.Fencer); ok {
		go func() {
			select {
			case <-f.Fenced():
			case <-vol.done:
			}
			// Fenced wins a tie. done is closed only once the handle is
			// closed, and a handle that was taken over finds it out as it
			// closes: so a volume whose last session ended (its initiator
			// moved to the target that took over) before the store looked
			// is reported all the same.
			select {
			case <-f.Fenced():
				t.storeFailed(vol, fmt.Errorf("%w (found by the store)", store.ErrFenced))
			default:
			}
		}()
	}
	return vol, nil
}

// releaseVolume drops a session's reference; the last one closes the
// store handle (after a flush).
func (t *Target) releaseVolume(vol *volume) {
	t.mu.Lock()
	vol.refs--
	last := vol.refs == 0
	if last && t.vols[vol.name] == vol {
		delete(t.vols, vol.name)
	}
	t.mu.Unlock()
	if last {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := vol.v.Flush(ctx); err != nil {
			t.log.Error("flushing volume at last logout", "volume", vol.name, "err", err)
		}
		cancel()
		if err := vol.v.Close(); err != nil {
			t.log.Error("closing volume", "volume", vol.name, "err", err)
		}
		close(vol.done)
	}
}

// storeFailed handles a store error of a command on vol. It reports true
// when the store fenced the handle (another target took the volume over):
// then the command must not be answered. Every session of the volume ends
// without answering what it has in flight, so their initiators replay it
// at the target that took over, and the handle is dropped: a later login
// here opens the volume afresh (taking it back).
func (t *Target) storeFailed(vol *volume, err error) bool {
	if !errors.Is(err, store.ErrFenced) {
		return false
	}
	if !vol.fenced.CompareAndSwap(false, true) {
		return true
	}
	t.log.Warn("volume fenced: another target took it over; ending its sessions", "volume", vol.name, "err", err)
	t.m.Fenced.Add(1)
	t.mu.Lock()
	if t.vols[vol.name] == vol {
		delete(t.vols, vol.name)
	}
	t.mu.Unlock()
	vol.mu.Lock()
	var sessions []*session
	for _, s := range vol.slots {
		if s != nil {
			sessions = append(sessions, s)
		}
	}
	vol.mu.Unlock()
	for _, s := range sessions {
		go s.end("volume fenced: another target took it over")
	}
	return true
}
