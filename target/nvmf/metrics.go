package nvmf

import (
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/target"
)

// Metrics are the NVMe/RDMA front end's counters, plain atomics a metrics
// exporter reads whenever it likes. The per-operation counters use the
// native target's operation kinds and latency buckets, so both front ends
// read alike.
type Metrics struct {
	Controllers      atomic.Int64  // controllers now (discovery ones included)
	ControllersTotal atomic.Uint64 // controllers ever created
	Queues           atomic.Int64  // connected queues now (admin and I/O)
	ConnectFailures  atomic.Uint64 // connections rejected and Connect commands refused
	ProtocolErrors   atomic.Uint64 // queues ended for a transport or protocol error
	KeepAliveExpired atomic.Uint64 // controllers dropped because the host went silent

	Ops       [target.NumOps]atomic.Uint64 // I/O commands completed, by kind
	Errors    [target.NumOps]atomic.Uint64 // I/O commands completed with an error status
	Latency   [target.NumOps]target.Histogram
	BytesRead atomic.Uint64 // data sent to hosts by Read
	BytesWrit atomic.Uint64 // data stored by Write (Write Zeroes and trims not included)

	ReservationConflicts atomic.Uint64 // commands refused for a reservation
	InCapsuleWrites      atomic.Uint64 // writes whose data came in the command capsule
}

func (m *Metrics) done(k target.OpKind, start time.Time, failed bool) {
	m.Ops[k].Add(1)
	if failed {
		m.Errors[k].Add(1)
	}
	m.Latency[k].Observe(time.Since(start))
}
