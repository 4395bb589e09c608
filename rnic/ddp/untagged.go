package ddp

import "encoding/binary"

// Untagged is a view of an untagged DDP header: at least UntaggedHeaderLen
// bytes.
type Untagged []byte

// UntaggedFields holds the variable fields of an untagged header.
type UntaggedFields struct {
	Last     bool
	RsvdULP0 uint8  // the RDMAP control byte
	RsvdULP1 uint32 // RDMAP's Invalidate STag (zero unless Send with Invalidate)
	QN       uint32
	MSN      uint32
	MO       uint32
}

// Last reports the L bit.
func (h Untagged) Last() bool { return h[0]&FlagLast != 0 }

// DV returns the DDP version bits.
func (h Untagged) DV() uint8 { return h[0] & maskVersion }

// RsvdULP0 returns the first RsvdULP octet (RDMAP's control byte).
func (h Untagged) RsvdULP0() uint8 { return h[1] }

// RsvdULP1 returns RsvdULP octets 2..5 (RDMAP's Invalidate STag).
func (h Untagged) RsvdULP1() uint32 { return binary.BigEndian.Uint32(h[2:6]) }

// QN returns the queue number.
func (h Untagged) QN() uint32 { return binary.BigEndian.Uint32(h[6:10]) }

// MSN returns the message sequence number.
func (h Untagged) MSN() uint32 { return binary.BigEndian.Uint32(h[10:14]) }

// MO returns the message offset of this segment's payload.
func (h Untagged) MO() uint32 { return binary.BigEndian.Uint32(h[14:18]) }

// SetLast sets or clears the L bit.
func (h Untagged) SetLast(last bool) { setLast(&h[0], last) }

// SetRsvdULP0 sets the RDMAP control byte.
func (h Untagged) SetRsvdULP0(v uint8) { h[1] = v }

// SetRsvdULP1 sets RsvdULP octets 2..5.
func (h Untagged) SetRsvdULP1(v uint32) { binary.BigEndian.PutUint32(h[2:6], v) }

// SetQN sets the queue number.
func (h Untagged) SetQN(v uint32) { binary.BigEndian.PutUint32(h[6:10], v) }

// SetMSN sets the message sequence number.
func (h Untagged) SetMSN(v uint32) { binary.BigEndian.PutUint32(h[10:14], v) }

// SetMO sets the message offset.
func (h Untagged) SetMO(v uint32) { binary.BigEndian.PutUint32(h[14:18], v) }

// Encode writes a complete untagged header: T=0, DV=1, reserved bits zero.
func (h Untagged) Encode(f *UntaggedFields) {
	_ = h[UntaggedHeaderLen-1]
	h[0] = ctrl(false, f.Last)
	h[1] = f.RsvdULP0
	h.SetRsvdULP1(f.RsvdULP1)
	h.SetQN(f.QN)
	h.SetMSN(f.MSN)
	h.SetMO(f.MO)
}

// Fields returns the header's variable fields.
func (h Untagged) Fields() UntaggedFields {
	return UntaggedFields{Last: h.Last(), RsvdULP0: h.RsvdULP0(), RsvdULP1: h.RsvdULP1(),
		QN: h.QN(), MSN: h.MSN(), MO: h.MO()}
}
