package target

import (
	"sync/atomic"
	"time"
)

// OpKind indexes the per-operation counters.
type OpKind int

// Operation kinds.
const (
	OpRead OpKind = iota
	OpWrite
	OpFlush
	OpTrim
	OpWriteZeroes
	NumOps
)

var opKindNames = [NumOps]string{"read", "write", "flush", "trim", "write_zeroes"}

func (k OpKind) String() string { return opKindNames[k] }

// LatencyBuckets are the upper bounds of the latency histogram's buckets;
// a last, implicit bucket counts everything slower.
var LatencyBuckets = [...]time.Duration{
	25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond,
	500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second,
}

// Histogram is a latency histogram with fixed buckets (LatencyBuckets),
// updated with atomics.
type Histogram struct {
	Buckets [len(LatencyBuckets) + 1]atomic.Uint64
	Count   atomic.Uint64
	SumNs   atomic.Uint64
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	i := 0
	for i < len(LatencyBuckets) && d > LatencyBuckets[i] {
		i++
	}
	h.Buckets[i].Add(1)
	h.Count.Add(1)
	h.SumNs.Add(uint64(max(d, 0)))
}

// Metrics are the target's counters: plain atomics a metrics exporter reads
// whenever it likes.
type Metrics struct {
	SessionsActive atomic.Int64  // sessions logged in now
	SessionsTotal  atomic.Uint64 // sessions ever created
	QPsActive      atomic.Int64  // logged-in QPs now
	LoginFailures  atomic.Uint64 // logins refused (authentication, unknown volume, limits)
	ProtocolErrors atomic.Uint64 // sessions ended for a protocol violation

	Ops       [NumOps]atomic.Uint64 // commands completed, by kind
	Errors    [NumOps]atomic.Uint64 // commands answered with a status other than OK
	Latency   [NumOps]Histogram     // from command arrival to answer
	BytesRead atomic.Uint64
	BytesWrit atomic.Uint64

	StaleTokens   atomic.Uint64 // commands refused for a stale fencing token
	ReservedFails atomic.Uint64 // commands refused for another session's reservation
	LeaseExpired  atomic.Uint64 // READ buffers revoked by the target (no RELEASE in time)
	LocksCleared  atomic.Uint64 // locks and reservations cleared at session end
	Fenced        atomic.Uint64 // volume handles the store fenced (another target took the volume over)
	GrantsIssued  atomic.Uint64 // write grants advertised
	TwoStepWrites atomic.Uint64 // writes through WRITE_REQ
	InlineReads   atomic.Uint64 // READs answered with DATA
	ReadsHere     atomic.Uint64 // of those, answered by the completion handler (readHere)
	WritesHere    atomic.Uint64 // granted WRITEs a store not in memory took on the completion handler (writeHere)
}

func (m *Metrics) done(k OpKind, start time.Time, failed bool) {
	m.Ops[k].Add(1)
	if failed {
		m.Errors[k].Add(1)
	}
	m.Latency[k].Observe(time.Since(start))
}
