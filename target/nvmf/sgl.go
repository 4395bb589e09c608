package nvmf

import "encoding/binary"

// SGL is one 16-byte SGL descriptor (NVMe Base 2.0 §4.1.2, Figure 91).
// NVMe/RDMA hosts send one in the command's data pointer:
//   - a Keyed SGL Data Block (type 4): the host's buffer, which the
//     controller reads with RDMA Read or fills with RDMA Write: a 64-bit
//     address, a 24-bit length and a 32-bit key (the host's STag).
//     Subtype 0xF asks the controller to invalidate the key with its
//     completion (Send with Invalidate);
//   - an SGL Data Block (type 0) with subtype 1 (offset): data carried in
//     the command capsule itself, at that offset after the command.
//
// A command without data sends a keyed descriptor of length 0, key 0.
type SGL []byte

// SGL descriptor types and subtypes.
const (
	SGLTypeData        = 0x0
	SGLTypeBitBucket   = 0x1
	SGLTypeSegment     = 0x2
	SGLTypeLastSegment = 0x3
	SGLTypeKeyedData   = 0x4

	SGLSubAddress    = 0x0
	SGLSubOffset     = 0x1
	SGLSubInvalidate = 0xf // keyed: address, and invalidate the key
)

// SGLLen is the size of a descriptor.
const SGLLen = 16

// MaxKeyedLen is the largest length a keyed descriptor can say (24 bits).
const MaxKeyedLen = 1<<24 - 1

// Type is the descriptor type (byte 15 bits 7:4).
func (s SGL) Type() uint8 { return s[15] >> 4 }

// Subtype is byte 15 bits 3:0.
func (s SGL) Subtype() uint8 { return s[15] & 0xf }

// Addr is the address (keyed) or the offset (in-capsule data).
func (s SGL) Addr() uint64 { return binary.LittleEndian.Uint64(s[0:]) }

// Len is the length: 24 bits for a keyed descriptor, 32 otherwise.
func (s SGL) Len() uint32 {
	if s.Type() == SGLTypeKeyedData {
		return uint32(s[8]) | uint32(s[9])<<8 | uint32(s[10])<<16
	}
	return binary.LittleEndian.Uint32(s[8:])
}

// Key is the keyed descriptor's key.
func (s SGL) Key() uint32 { return binary.LittleEndian.Uint32(s[11:]) }

// SGLFields are the fields of a descriptor to encode.
type SGLFields struct {
	Type, Subtype uint8
	Addr          uint64
	Len           uint32 // at most MaxKeyedLen for a keyed descriptor
	Key           uint32 // keyed only
}

// Encode writes f into s (16 bytes).
func (s SGL) Encode(f *SGLFields) {
	clear(s[:SGLLen])
	binary.LittleEndian.PutUint64(s[0:], f.Addr)
	if f.Type == SGLTypeKeyedData {
		s[8], s[9], s[10] = byte(f.Len), byte(f.Len>>8), byte(f.Len>>16)
		binary.LittleEndian.PutUint32(s[11:], f.Key)
	} else {
		binary.LittleEndian.PutUint32(s[8:], f.Len)
	}
	s[15] = f.Type<<4 | f.Subtype&0xf
}

// Data says where a command's data is, once its descriptor is checked.
type Data struct {
	// Len is the data length in bytes (0: no data).
	Len uint32
	// InCapsule: the data follows the command in the capsule, at Offset.
	InCapsule bool
	Offset    uint32
	// Keyed: the data is in the host's memory at Addr under Key; Invalidate
	// asks for the key to be invalidated with the completion.
	Addr       uint64
	Key        uint32
	Invalidate bool
}

// ParseData checks a command's data pointer against the capsule that
// carried it (inCapsule bytes after the command) and the largest data
// length the command may move (maxLen). It fails with the NVMe status for
// the fault: a PRP data pointer, a descriptor type or subtype this
// transport does not take, in-capsule data outside the capsule, a length
// above maxLen.
func ParseData(c Command, inCapsule int, maxLen uint32) (Data, error) {
	if c.PSDT() != PSDTSGL {
		return Data{}, fail(StatusInvalidField, "PSDT %d: fabrics commands use SGLs", c.PSDT())
	}
	s := c.DPTR()
	switch s.Type() {
	case SGLTypeKeyedData:
		if st := s.Subtype(); st != SGLSubAddress && st != SGLSubInvalidate {
			return Data{}, fail(StatusSGLInvalidSubtype, "keyed SGL subtype 0x%x", st)
		}
		d := Data{Len: s.Len(), Addr: s.Addr(), Key: s.Key(), Invalidate: s.Subtype() == SGLSubInvalidate}
		if d.Len > maxLen {
			return Data{}, fail(StatusSGLInvalidData, "keyed SGL of %d bytes, at most %d", d.Len, maxLen)
		}
		if d.Len == 0 && d.Invalidate {
			return Data{}, fail(StatusSGLInvalidData, "invalidate of key 0x%08x with no data", d.Key)
		}
		return d, nil
	case SGLTypeData:
		if s.Subtype() != SGLSubOffset {
			return Data{}, fail(StatusSGLInvalidSubtype, "data block SGL subtype 0x%x (want 1, offset)", s.Subtype())
		}
		off, n := s.Addr(), s.Len()
		if n > maxLen {
			return Data{}, fail(StatusSGLInvalidData, "in-capsule SGL of %d bytes, at most %d", n, maxLen)
		}
		if off > uint64(inCapsule) || uint64(n) > uint64(inCapsule)-off {
			return Data{}, fail(StatusSGLInvalidOffset, "in-capsule data at offset %d length %d, the capsule has %d bytes",
				off, n, inCapsule)
		}
		return Data{Len: n, InCapsule: true, Offset: uint32(off)}, nil
	}
	return Data{}, fail(StatusSGLInvalidType, "SGL descriptor type 0x%x", s.Type())
}
