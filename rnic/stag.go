package rnic

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// The STag table: one 24-bit index space shared by memory regions and memory
// windows (draft §7.2). An index is slot | random<<slotBits: the slot makes a
// lookup one array access, the random upper bits (and a random free slot)
// make indexes unpredictable, and a reused slot gets new random bits, so an
// old STag never names the new entry.
//
// Every access through an STag runs under the entry's read lock, and every
// state change (invalidate, deregister, bind, fast-register) under its write
// lock, so an invalidation waits for in-flight placement to finish and no
// byte is placed through an STag once its invalidation has returned. The
// receive holds the read lock only while it copies bytes that have arrived:
// it waits for the rest of a segment without it, and checks the STag again
// after (rxState.place), so a peer that stalls inside a segment cannot make
// an invalidation wait for it.

type entryKind uint8

const (
	kindMR entryKind = iota + 1
	kindMW
)

type stagEntry struct {
	mu sync.RWMutex

	index uint32
	key   uint8
	kind  entryKind
	valid bool
	gone  bool // deallocated

	pd         *PD
	access     Access
	remoteFlag bool // Remote Access Flag (MRs)
	shared     bool // MR shared by Register Shared MR
	maxPBL     int  // PBL capacity (MRs)

	mem       mapping
	base      uint64 // TO of the first byte
	length    uint64
	zeroBased bool
	// placed is how many bytes from the region's first byte inbound
	// tagged placement has filled without a gap since the mapping was last
	// set (MR.Placed). Atomic: placements hold only the read lock, and a
	// window's hold only the window's.
	placed atomic.Uint64

	// Memory windows: the QP and region a valid window is bound to.
	qp    *QP
	mr    *stagEntry
	mwOff uint64 // offset of the window's first byte within the region
	// Memory regions: how many windows are bound to it.
	mwCount int
}

func (e *stagEntry) stag() STag { return MakeSTag(e.index, e.key) }

type stagTable struct {
	mu       sync.RWMutex
	slots    []*stagEntry
	free     []uint32
	max      int
	slotBits uint
	rnd      func() uint32
}

func newStagTable(max int, rnd func() uint32) *stagTable {
	if max > 1<<23 {
		max = 1 << 23
	}
	sb := uint(bits.Len(uint(max - 1)))
	if sb < 8 {
		sb = 8
	}
	return &stagTable{max: max, slotBits: sb, rnd: rnd}
}

// alloc gives e a fresh, unpredictable index.
func (t *stagTable) alloc(e *stagEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.free) == 0 {
		n := len(t.slots)
		grow := n
		if grow < 256 {
			grow = 256
		}
		if n+grow > t.max {
			grow = t.max - n
		}
		if grow <= 0 {
			return fmt.Errorf("rnic: STag table full (%d entries): %w", t.max, ErrInsufficientResources)
		}
		t.slots = append(t.slots, make([]*stagEntry, grow)...)
		for i := n; i < n+grow; i++ {
			t.free = append(t.free, uint32(i))
		}
	}
	r := t.rnd()
	i := int(r % uint32(len(t.free)))
	slot := t.free[i]
	t.free[i] = t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	for {
		hi := t.rnd() & (1<<(24-t.slotBits) - 1)
		idx := hi<<t.slotBits | slot
		if idx != 0 {
			e.index = idx
			break
		}
	}
	t.slots[slot] = e
	return nil
}

// lookup returns the entry an STag's index names, or nil. The key and the
// entry's state are checked by the caller under the entry's lock.
func (t *stagTable) lookup(s STag) *stagEntry {
	idx := s.Index()
	if idx == 0 {
		return nil
	}
	slot := idx & (1<<t.slotBits - 1)
	t.mu.RLock()
	var e *stagEntry
	if int(slot) < len(t.slots) {
		e = t.slots[slot]
	}
	t.mu.RUnlock()
	if e == nil || e.index != idx {
		return nil
	}
	return e
}

// release frees e's slot. The caller holds e.mu and has marked it gone.
func (t *stagTable) release(e *stagEntry) {
	t.mu.Lock()
	slot := e.index & (1<<t.slotBits - 1)
	if int(slot) < len(t.slots) && t.slots[slot] == e {
		t.slots[slot] = nil
		t.free = append(t.free, slot)
	}
	t.mu.Unlock()
}

// clear invalidates every entry (device close). Lock order is entry, then
// table (Dealloc releases a slot while holding its entry), so the entries
// are collected first and locked without the table lock.
func (t *stagTable) clear() {
	t.mu.Lock()
	entries := make([]*stagEntry, 0, len(t.slots))
	for _, e := range t.slots {
		if e != nil {
			entries = append(entries, e)
		}
	}
	t.slots = nil
	t.free = nil
	t.mu.Unlock()
	// Windows first: a placement through a window holds only the window's
	// lock while it copies into its region's memory (remoteAccess), so a
	// region's mapping may be dropped only once no window reaches it. A
	// receive goroutine that outlived Config.CloseTimeout may still be
	// placing.
	for _, kind := range [...]entryKind{kindMW, kindMR} {
		for _, e := range entries {
			if e.kind != kind {
				continue
			}
			e.mu.Lock()
			e.gone = true
			e.valid = false
			e.mem = mapping{}
			e.mu.Unlock()
		}
	}
}

// notePlaced records that n bytes were placed at region offset off: the
// placed prefix grows when they start inside it (or right at its end) and
// end past it. Bytes placed beyond a gap are not counted, so the prefix
// never claims a byte that was not placed since the mapping was set.
func (e *stagEntry) notePlaced(off, n uint64) {
	for {
		p := e.placed.Load()
		if off > p || off+n <= p || e.placed.CompareAndSwap(p, off+n) {
			return
		}
	}
}

// region is the memory region whose mapping an access through e reaches:
// e itself, or the region a window is bound to.
func (e *stagEntry) region() *stagEntry {
	if e.kind == kindMW {
		return e.mr
	}
	return e
}

// accessFault classifies a failed tagged access; callers map it to a DDP or
// RDMAP Terminate code, a completion status or an async event.
type accessFault uint8

const (
	faultNone      accessFault = iota
	faultSTag                  // unknown, wrong key, invalid, deallocated, STag 0, wrong kind
	faultPD                    // PD mismatch, or window bound to another QP
	faultRights                // the right is missing on the STag (or the QP)
	faultBounds                // outside the region or window
	faultWrap                  // TO + length wraps 2^64
	faultAlignment             // atomic target not 8-byte aligned
)

func (f accessFault) String() string {
	return [...]string{"ok", "invalid STag", "STag not associated", "access rights violation",
		"base or bounds violation", "TO wrap", "misaligned"}[f]
}

// checkRange checks [to, to+n) against the entry's range and returns the
// offset into the mapping. n > 0.
func (e *stagEntry) checkRange(to, n uint64) (uint64, accessFault) {
	if to < e.base {
		return 0, faultBounds
	}
	off := to - e.base
	if off >= e.length {
		return 0, faultBounds
	}
	if n-1 > math.MaxUint64-to {
		return 0, faultWrap
	}
	if n > e.length-off {
		return 0, faultBounds
	}
	return off, faultNone
}

// remoteAccess validates an inbound tagged access through s by qp needing
// right, for n > 0 bytes at to (draft C14.1, C11.13). It must be called with
// e.mu read-locked. It returns the mapping and offset to use.
func (e *stagEntry) remoteAccess(qp *QP, s STag, to, n uint64, right Access) (*mapping, uint64, accessFault) {
	if e.gone || !e.valid || e.key != s.Key() {
		return nil, 0, faultSTag
	}
	switch e.kind {
	case kindMR:
		if e.pd != qp.pd {
			return nil, 0, faultPD
		}
	case kindMW:
		if e.qp != qp {
			return nil, 0, faultPD
		}
	}
	if e.access&right == 0 {
		return nil, 0, faultRights
	}
	off, f := e.checkRange(to, n)
	if f != faultNone {
		return nil, 0, f
	}
	if e.kind == kindMW {
		// A window's TO range maps onto its region's memory.
		return &e.mr.mem, e.mwOff + off, faultNone
	}
	return &e.mem, off, faultNone
}

// localAccess validates a local SGE use (draft C14.2) under e.mu read lock.
func (e *stagEntry) localAccess(pd *PD, s STag, to, n uint64, right Access) (*mapping, uint64, Status) {
	if e.gone || !e.valid || e.key != s.Key() || e.kind != kindMR {
		return nil, 0, StatusInvalidSTag
	}
	if e.pd != pd {
		return nil, 0, StatusInvalidPD
	}
	if e.access&right == 0 {
		return nil, 0, StatusAccessViolation
	}
	off, f := e.checkRange(to, n)
	switch f {
	case faultWrap:
		return nil, 0, StatusWrap
	case faultBounds:
		return nil, 0, StatusBaseBounds
	}
	return &e.mem, off, StatusSuccess
}
