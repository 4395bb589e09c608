package mpa

import (
	"encoding/binary"

	"github.com/rnic-dev/rnic/rnic/term"
)

// IRDORDLen is the size of the RFC 6581 IRD/ORD block.
const IRDORDLen = 4

// MaxIRDORD is the largest IRD or ORD the 14-bit fields can carry.
const MaxIRDORD = 0x3FFF

const (
	irdordHigh = 0x8000 // word 0: P2P; word 1: RTR zero-length RDMA Write
	irdordLow  = 0x4000 // word 0: RTR zero-length Send; word 1: RTR zero-length RDMA Read
)

// IRDORD is the RFC 6581 enhanced connection data that starts the private
// data of a revision 2 frame with FlagEnhanced set: two big-endian 16-bit
// words, P2P | RTRSend | IRD and RTRWrite | RTRRead | ORD.
type IRDORD struct {
	IRD, ORD uint16 // 14 bits each: the frame sender's inbound/outbound RDMA Read queue depth
	P2P      bool   // peer-to-peer mode: a Ready To Receive message will be sent
	RTRSend  bool   // RTR as a zero-length Send
	RTRWrite bool   // RTR as a zero-length RDMA Write
	RTRRead  bool   // RTR as a zero-length RDMA Read
}

func bit(v bool, m uint16) uint16 {
	if v {
		return m
	}
	return 0
}

// Put writes the block into b[:4]. IRD and ORD above MaxIRDORD are sent as
// MaxIRDORD.
func (p IRDORD) Put(b []byte) {
	_ = b[IRDORDLen-1]
	binary.BigEndian.PutUint16(b[0:2], bit(p.P2P, irdordHigh)|bit(p.RTRSend, irdordLow)|min(p.IRD, MaxIRDORD))
	binary.BigEndian.PutUint16(b[2:4], bit(p.RTRWrite, irdordHigh)|bit(p.RTRRead, irdordLow)|min(p.ORD, MaxIRDORD))
}

// ParseIRDORD decodes the block at the start of b. Fewer than 4 bytes is an
// invalid MPA frame (LLP / MPA / 0x04). Every bit combination is
// well-formed; whether the RTR choice is acceptable is the connection
// manager's decision (LLP / MPA / 0x06, 0x07).
func ParseIRDORD(b []byte) (IRDORD, error) {
	if len(b) < IRDORDLen {
		return IRDORD{}, term.Errorf(term.LayerLLP, term.LLPMPA, term.MPAInvalidFrame,
			"enhanced private data of %d bytes, shorter than the %d-byte IRD/ORD block", len(b), IRDORDLen)
	}
	w0, w1 := binary.BigEndian.Uint16(b[0:2]), binary.BigEndian.Uint16(b[2:4])
	return IRDORD{
		IRD: w0 & MaxIRDORD, ORD: w1 & MaxIRDORD,
		P2P: w0&irdordHigh != 0, RTRSend: w0&irdordLow != 0,
		RTRWrite: w1&irdordHigh != 0, RTRRead: w1&irdordLow != 0,
	}, nil
}
