package blockproto

// The lock table: an array of 8-byte words in target memory, in the
// target's native byte order, named by the STag and TO in the WELCOME and
// accessed with RFC 7306 atomics (see the package documentation).
const (
	// WordReservation is the index of the volume reservation word.
	WordReservation = 0
	// WordGeneration is the index of the generation counter that fencing
	// tokens are drawn from.
	WordGeneration = 1
	// FirstLockWord is the index of numbered lock 0; words 2-7 are
	// reserved and stay zero.
	FirstLockWord = 8
	// MaxSlot is the highest reservation slot: a volume has at most
	// MaxSlot+1 = 63 sessions.
	MaxSlot = 62
	// MaxLocks bounds the number of numbered locks of a volume.
	MaxLocks = 1 << 20
	// ReservationExclusive is bit 63 of the reservation word.
	ReservationExclusive = uint64(1) << 63
	// lockSeqMask selects the holder's 56-bit acquisition sequence of a
	// lock word.
	lockSeqMask = uint64(1)<<56 - 1
)

// LockTableLen is the size in bytes of a lock table with n numbered locks.
func LockTableLen(n uint32) int { return (FirstLockWord + int(n)) * 8 }

// WordOffset is the byte offset of word i from the table's start (add the
// WELCOME's LockTO for the tagged offset).
func WordOffset(i int) uint64 { return uint64(i) * 8 }

// LockOffset is the byte offset of numbered lock n from the table's start.
func LockOffset(n uint32) uint64 { return WordOffset(FirstLockWord + int(n)) }

// Reservation is a value of the reservation word.
//
//	0                         free
//	bit 63 | 1<<s             exclusive, held by the session in slot s
//	bit 63 clear, bits 0-62   shared, held by every slot whose bit is set
type Reservation uint64

// SlotBit is the bit of slot s (s <= MaxSlot).
func SlotBit(s uint8) uint64 { return uint64(1) << (s & 63) }

// Exclusive is the reservation word of an exclusive reservation by s.
func Exclusive(s uint8) Reservation { return Reservation(ReservationExclusive | SlotBit(s)) }

// Free reports whether nobody holds a reservation.
func (r Reservation) Free() bool { return r == 0 }

// IsExclusive reports bit 63.
func (r Reservation) IsExclusive() bool { return uint64(r)&ReservationExclusive != 0 }

// Holds reports whether slot s holds the reservation (in either mode).
func (r Reservation) Holds(s uint8) bool { return s <= MaxSlot && uint64(r)&SlotBit(s) != 0 }

// Slots returns the bitmask of holder slots.
func (r Reservation) Slots() uint64 { return uint64(r) &^ ReservationExclusive }

// FirstHolder returns the lowest holder slot (ok false if free).
func (r Reservation) FirstHolder() (uint8, bool) {
	m := r.Slots()
	if m == 0 {
		return 0, false
	}
	var s uint8
	for m&1 == 0 {
		m >>= 1
		s++
	}
	return s, true
}

// Without returns the word with slot s removed: an exclusive reservation by
// s becomes free, a shared one loses s's bit.
func (r Reservation) Without(s uint8) Reservation {
	m := r.Slots() &^ SlotBit(s)
	if m == 0 {
		return 0
	}
	return Reservation(uint64(r)&ReservationExclusive | m)
}

// WriteAllowed reports whether the session in slot s may write under r:
// when r is free, or exclusive with s as the holder. A shared reservation
// forbids every write.
func (r Reservation) WriteAllowed(s uint8) bool {
	return r == 0 || (r.IsExclusive() && r.Slots() == SlotBit(s) && s <= MaxSlot)
}

// LockValue is the word of a numbered lock held by slot s: (s+1) in bits
// 56-63 and the holder's acquisition sequence (any value; its low 56 bits
// are kept) below, so a release can name the exact acquisition.
func LockValue(s uint8, seq uint64) uint64 { return uint64(s+1)<<56 | seq&lockSeqMask }

// LockHolder returns the slot holding a lock word (held false for 0, or
// for a word whose top byte names no valid slot).
func LockHolder(w uint64) (slot uint8, held bool) {
	top := uint8(w >> 56)
	if w == 0 || top == 0 || top-1 > MaxSlot {
		return 0, false
	}
	return top - 1, true
}

// Stale reports whether a fencing token is stale: token T (non-zero) is
// stale when T <= floor, the generation value the target raised the
// counter to when it last cleared an ended session's lock or reservation,
// or when T > gen, the counter's current value (a token never issued).
// Token 0 means "unfenced" and is never stale.
func Stale(token, floor, gen uint64) bool { return token != 0 && (token <= floor || token > gen) }
