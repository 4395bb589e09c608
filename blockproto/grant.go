package blockproto

import "encoding/binary"

// GrantLen is the length of a buffer descriptor.
const GrantLen = 16

// Grant is a view of a 16-byte buffer descriptor: an STag of the target's,
// the length of the buffer it names and the tagged offset of its first
// byte. STag 0 means "no buffer".
type Grant []byte

// GrantFields are a descriptor's fields.
type GrantFields struct {
	STag uint32
	Len  uint32
	TO   uint64
}

// STag returns the STag (0: none).
func (g Grant) STag() uint32 { return binary.BigEndian.Uint32(g[0:4]) }

// Len returns the buffer's length in bytes.
func (g Grant) Len() uint32 { return binary.BigEndian.Uint32(g[4:8]) }

// TO returns the tagged offset of the buffer's first byte.
func (g Grant) TO() uint64 { return binary.BigEndian.Uint64(g[8:16]) }

// Encode writes the descriptor.
func (g Grant) Encode(f *GrantFields) {
	_ = g[GrantLen-1]
	binary.BigEndian.PutUint32(g[0:4], f.STag)
	binary.BigEndian.PutUint32(g[4:8], f.Len)
	binary.BigEndian.PutUint64(g[8:16], f.TO)
}

// Fields returns the descriptor's fields.
func (g Grant) Fields() GrantFields { return GrantFields{STag: g.STag(), Len: g.Len(), TO: g.TO()} }

// check validates a descriptor: with no STag every field is zero; with one
// the length is not zero.
func (g Grant) check(what string) error {
	if g.STag() == 0 {
		if g.Len() != 0 || g.TO() != 0 {
			return errorf(ErrReserved, "%s: length or offset set without an STag", what)
		}
		return nil
	}
	if g.Len() == 0 {
		return errorf(ErrField, "%s: zero-length buffer", what)
	}
	if g.TO()+uint64(g.Len()) < g.TO() {
		return errorf(ErrField, "%s: offset 0x%x + length %d wraps", what, g.TO(), g.Len())
	}
	return nil
}
