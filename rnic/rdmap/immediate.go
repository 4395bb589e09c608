package rdmap

import "encoding/binary"

// Immediate is a view of the 8 bytes of an Immediate Data message (RFC 7306
// §6.2).
type Immediate []byte

// Data returns the immediate data as a big-endian uint64.
func (m Immediate) Data() uint64 { return binary.BigEndian.Uint64(m[:ImmediateLen]) }

// SetData writes the immediate data.
func (m Immediate) SetData(v uint64) { binary.BigEndian.PutUint64(m[:ImmediateLen], v) }

// ParseImmediate checks that an Immediate Data message carries exactly
// ImmediateLen bytes after its DDP header (RFC 7306 §6.3); otherwise it is
// RDMA / Remote Operation / Unspecified (0/2/0xFF, RFC 5040 §4.8: RFC 7306
// §8.2 names no code for it).
func ParseImmediate(b []byte) (Immediate, error) {
	if len(b) != ImmediateLen {
		return nil, lengthError(OpImmediate, len(b), ImmediateLen)
	}
	return Immediate(b[:ImmediateLen:ImmediateLen]), nil
}
