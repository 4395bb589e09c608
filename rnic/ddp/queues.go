package ddp

import "github.com/rnic-dev/rnic/rnic/term"

// MaxQueues is the largest number of untagged queues RxQueues tracks and
// the number TxQueues tracks: RDMAP's QN 0..2 plus RFC 7306's QN 3.
const MaxQueues = 4

// firstMSN is the MSN of the first message on every queue (RFC 5041).
const firstMSN = 1

// RxQueues is the untagged receive state of one direction of one stream:
// for each QN, the MSN of the message in progress (or next expected) and the
// payload bytes of it received so far. It is not safe for concurrent use:
// one receive loop owns it.
type RxQueues struct {
	n   int
	msn [MaxQueues]uint32
	got [MaxQueues]uint32
}

// NewRxQueues returns the state for QNs 0..numQN-1 (RDMAP: 3, or 4 with the
// RFC 7306 atomics). numQN is clamped to 0..MaxQueues.
func NewRxQueues(numQN int) *RxQueues {
	q := &RxQueues{n: max(0, min(numQN, MaxQueues))}
	for i := range q.msn {
		q.msn[i] = firstMSN
	}
	return q
}

// NumQueues returns how many QNs are valid.
func (q *RxQueues) NumQueues() int { return q.n }

// Check validates an accepted-looking untagged header carrying payloadLen
// payload bytes against the queue state, without changing it: the QN must
// be valid (1/2/0x01), the MSN must be the expected one on that QN (1/2/0x03)
// and the MO must equal the bytes already received of the message, with the
// message staying addressable by a 32-bit MO: no segment runs past 2^32 and
// only the last may end there (1/2/0x04).
func (q *RxQueues) Check(h Untagged, payloadLen int) error {
	qn := h.QN()
	if uint64(qn) >= uint64(q.n) {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN,
			"QN %d, valid QNs are 0..%d", qn, q.n-1)
	}
	if msn, want := h.MSN(), q.msn[qn]; msn != want {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedMSNRange,
			"QN %d MSN %d, expected %d", qn, msn, want)
	}
	mo, got := h.MO(), q.got[qn]
	if mo != got {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO,
			"QN %d MSN %d MO %d, expected %d (bytes received so far)", qn, h.MSN(), mo, got)
	}
	end := uint64(mo) + uint64(payloadLen)
	if payloadLen < 0 || end > 1<<32 {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO,
			"QN %d MSN %d MO %d with %d payload bytes runs past 2^32", qn, h.MSN(), mo, payloadLen)
	}
	// The MO is 32 bits (RFC 5041's untagged header): a
	// message may end at offset 2^32, but a segment that is not its last
	// must leave the next one an MO to start at, and 2^32 is not one (the
	// received count would wrap to 0 and accept a replay of offset 0).
	if end == 1<<32 && !h.Last() {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO,
			"QN %d MSN %d MO %d with %d payload bytes reaches 2^32 in a segment that is not the last", qn, h.MSN(), mo, payloadLen)
	}
	return nil
}

// Advance records an accepted segment (one Check passed): it adds its
// payload bytes to the message, and on the last segment moves the QN to the
// next MSN (0xFFFFFFFF wraps to 0) and resets the offset. Invalid QNs are
// ignored.
func (q *RxQueues) Advance(h Untagged, payloadLen int) {
	qn := h.QN()
	if uint64(qn) >= uint64(q.n) {
		return
	}
	if h.Last() {
		q.msn[qn]++
		q.got[qn] = 0
		return
	}
	q.got[qn] += uint32(payloadLen)
}

// ExpectedMSN returns the MSN the next segment on qn must carry, or 0 for an
// invalid QN.
func (q *RxQueues) ExpectedMSN(qn uint32) uint32 {
	if uint64(qn) >= uint64(q.n) {
		return 0
	}
	return q.msn[qn]
}

// Received returns the payload bytes received so far of the message in
// progress on qn (the MO its next segment must carry), or 0 for an invalid QN.
func (q *RxQueues) Received(qn uint32) uint32 {
	if uint64(qn) >= uint64(q.n) {
		return 0
	}
	return q.got[qn]
}

// TxQueues is the sender's MSN counters for QNs 0..MaxQueues-1. The zero
// value is ready: the first message on each QN gets MSN 1. It is not safe
// for concurrent use.
type TxQueues struct {
	sent [MaxQueues]uint32 // messages started on each QN, mod 2^32
}

// Next returns the MSN for a new message on qn and advances the counter
// (0xFFFFFFFF is followed by 0). QNs beyond MaxQueues are not tracked: Next
// returns 0 for them.
func (t *TxQueues) Next(qn uint32) uint32 {
	if qn >= MaxQueues {
		return 0
	}
	t.sent[qn]++
	return t.sent[qn] + firstMSN - 1
}
