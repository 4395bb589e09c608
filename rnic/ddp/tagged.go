package ddp

import "encoding/binary"

// Tagged is a view of a tagged DDP header: at least TaggedHeaderLen bytes.
type Tagged []byte

// TaggedFields holds the variable fields of a tagged header.
type TaggedFields struct {
	Last    bool
	RsvdULP uint8 // the RDMAP control byte
	STag    uint32
	TO      uint64
}

// Last reports the L bit.
func (h Tagged) Last() bool { return h[0]&FlagLast != 0 }

// DV returns the DDP version bits.
func (h Tagged) DV() uint8 { return h[0] & maskVersion }

// RsvdULP returns the byte reserved for the ULP (RDMAP's control byte).
func (h Tagged) RsvdULP() uint8 { return h[1] }

// STag returns the data sink STag.
func (h Tagged) STag() uint32 { return binary.BigEndian.Uint32(h[2:6]) }

// TO returns the tagged offset of this segment's first payload byte.
func (h Tagged) TO() uint64 { return binary.BigEndian.Uint64(h[6:14]) }

// SetLast sets or clears the L bit.
func (h Tagged) SetLast(last bool) { setLast(&h[0], last) }

// SetRsvdULP sets the RDMAP control byte.
func (h Tagged) SetRsvdULP(v uint8) { h[1] = v }

// SetSTag sets the STag.
func (h Tagged) SetSTag(v uint32) { binary.BigEndian.PutUint32(h[2:6], v) }

// SetTO sets the tagged offset.
func (h Tagged) SetTO(v uint64) { binary.BigEndian.PutUint64(h[6:14], v) }

// Encode writes a complete tagged header: T=1, DV=1, reserved bits zero.
func (h Tagged) Encode(f *TaggedFields) {
	_ = h[TaggedHeaderLen-1]
	h[0] = ctrl(true, f.Last)
	h[1] = f.RsvdULP
	h.SetSTag(f.STag)
	h.SetTO(f.TO)
}

// Fields returns the header's variable fields.
func (h Tagged) Fields() TaggedFields {
	return TaggedFields{Last: h.Last(), RsvdULP: h.RsvdULP(), STag: h.STag(), TO: h.TO()}
}
