package rnic

import (
	"fmt"
	"sync"

	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// EventType identifies an asynchronous event (draft §8.3.3, Fig. 37).
type EventType uint8

const (
	EventLLPCloseComplete EventType = iota + 1
	EventTerminateReceived
	EventLLPConnectionReset
	EventLLPConnectionLost
	EventLLPSegmentSize
	EventLLPInvalidCRC
	EventLLPBadFPDU
	EventInvalidDDPVersion
	EventInvalidRDMAVersion
	EventUnexpectedOpcode
	EventInvalidQN
	EventReadNotEnabled
	EventWriteNotEnabled
	EventInvalidReadRequest
	EventNoLBit
	EventInvalidSTag
	EventBaseBounds
	EventAccessRights
	EventInvalidPD
	EventWrap
	EventBadClose
	EventBadLLPClose
	EventRQInvalidMSN
	EventRQMessageTooLong
	EventIRRQTooMany
	EventIRRQInvalidMSN
	EventIRRQInvalidSTag
	EventIRRQBaseBounds
	EventIRRQAccessRights
	EventIRRQInvalidPD
	EventIRRQWrap
	EventInvalidateFailed
	EventMisalignedAtomic
	EventUnexpectedResponse
	EventCQSQError
	EventCQRQError
	// EventSRQErrorOnQP, EventLocalQPCatastrophic, EventCQOperationError,
	// EventSRQCatastrophic and EventRNICCatastrophic complete the draft's
	// list but are never raised: nothing in a software RNIC triggers them
	// (rnic/CHECKLIST.md, C13).
	EventSRQErrorOnQP
	EventLocalQPCatastrophic
	EventQPRQLimitReached
	EventCQOverflow
	EventCQOperationError
	EventSRQLimitReached
	EventSRQCatastrophic
	EventRNICCatastrophic
	EventProtocolError // any other inbound protocol error that terminated the stream
)

var eventNames = map[EventType]string{
	EventLLPCloseComplete: "LLP close complete", EventTerminateReceived: "terminate message received",
	EventLLPConnectionReset: "LLP connection reset", EventLLPConnectionLost: "LLP connection lost",
	EventLLPSegmentSize: "LLP integrity error: segment size invalid", EventLLPInvalidCRC: "LLP integrity error: invalid CRC",
	EventLLPBadFPDU: "LLP integrity error: bad FPDU", EventInvalidDDPVersion: "remote operation error: invalid DDP version",
	EventInvalidRDMAVersion: "remote operation error: invalid RDMA version", EventUnexpectedOpcode: "remote operation error: unexpected opcode",
	EventInvalidQN: "remote operation error: invalid DDP queue number", EventReadNotEnabled: "remote operation error: RDMA read not enabled",
	EventWriteNotEnabled: "remote operation error: RDMA write or read response not enabled", EventInvalidReadRequest: "remote operation error: invalid RDMA read request",
	EventNoLBit: "remote operation error: no L bit when expected", EventInvalidSTag: "protection error: invalid STag",
	EventBaseBounds: "protection error: tagged base and bounds violation", EventAccessRights: "protection error: tagged access rights violation",
	EventInvalidPD: "protection error: tagged invalid PD", EventWrap: "protection error: wrap error",
	EventBadClose: "bad close", EventBadLLPClose: "bad LLP close", EventRQInvalidMSN: "RQ protection error: invalid MSN",
	EventRQMessageTooLong: "RQ protection error: message too long", EventIRRQTooMany: "IRRQ protection error: too many RDMA read requests",
	EventIRRQInvalidMSN: "IRRQ protection error: invalid MSN", EventIRRQInvalidSTag: "IRRQ protection error: invalid STag",
	EventIRRQBaseBounds: "IRRQ protection error: base and bounds violation", EventIRRQAccessRights: "IRRQ protection error: access rights violation",
	EventIRRQInvalidPD: "IRRQ protection error: invalid PD", EventIRRQWrap: "IRRQ protection error: wrap error",
	EventInvalidateFailed: "remote invalidate failed", EventMisalignedAtomic: "remote operation error: misaligned atomic",
	EventUnexpectedResponse: "remote operation error: unexpected response", EventCQSQError: "CQ/SQ error",
	EventCQRQError: "CQ/RQ error", EventSRQErrorOnQP: "S-RQ error on a QP", EventLocalQPCatastrophic: "local QP catastrophic error",
	EventQPRQLimitReached: "QP RQ limit reached", EventCQOverflow: "CQ overflow detected", EventCQOperationError: "CQ operation error",
	EventSRQLimitReached: "S-RQ limit reached", EventSRQCatastrophic: "S-RQ catastrophic failure", EventRNICCatastrophic: "RNIC catastrophic failure",
	EventProtocolError: "protocol error",
}

func (e EventType) String() string {
	if n, ok := eventNames[e]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// ResourceKind says which resource an asynchronous event concerns.
type ResourceKind uint8

const (
	ResourceQP ResourceKind = iota + 1
	ResourceCQ
	ResourceSRQ
	ResourceRNIC
)

// AsyncEvent is an asynchronous event record (draft §9.4.2). QP events carry
// both the handle and the QP ID; when a Terminate was sent or received, it is
// attached (and stays readable through QP.Query).
type AsyncEvent struct {
	Type     EventType
	Resource ResourceKind
	QP       *QP
	QPID     uint32
	CQ       *CQ
	SRQ      *SRQ
	// Terminate is the Terminate message sent or received, if any;
	// TerminateSent says which (EventTerminateReceived: received).
	Terminate     *rdmap.TerminateFields
	TerminateSent bool
	// Err describes the cause in words (for logs).
	Err error
}

func (e AsyncEvent) String() string {
	s := e.Type.String()
	switch e.Resource {
	case ResourceQP:
		s += fmt.Sprintf(" (QP %d)", e.QPID)
	case ResourceCQ:
		s += " (CQ)"
	case ResourceSRQ:
		s += " (S-RQ)"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// dispatcher runs callbacks (async events and completion events) in order,
// one at a time, on its own goroutine and outside every engine lock, so that
// handlers may call any verb.
type dispatcher struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []func()
	closed bool
	done   chan struct{}
}

func newDispatcher() *dispatcher {
	d := &dispatcher{done: make(chan struct{})}
	d.cond = sync.NewCond(&d.mu)
	go d.run()
	return d
}

func (d *dispatcher) post(f func()) {
	d.mu.Lock()
	if !d.closed {
		d.queue = append(d.queue, f)
		d.cond.Signal()
	}
	d.mu.Unlock()
}

func (d *dispatcher) run() {
	defer close(d.done)
	for {
		d.mu.Lock()
		for len(d.queue) == 0 && !d.closed {
			d.cond.Wait()
		}
		if len(d.queue) == 0 && d.closed {
			d.mu.Unlock()
			return
		}
		f := d.queue[0]
		d.queue[0] = nil
		d.queue = d.queue[1:]
		d.mu.Unlock()
		f()
	}
}

// close stops accepting work, runs what is queued, and waits.
func (d *dispatcher) close() {
	d.mu.Lock()
	d.closed = true
	d.cond.Broadcast()
	d.mu.Unlock()
	<-d.done
}
