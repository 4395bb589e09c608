package blockproto

import "encoding/binary"

// ExtentsFixedLen is the length of an EXTENTS before its descriptors.
const ExtentsFixedLen = 32

// ExtentLen is the length of one extent descriptor.
const ExtentLen = 8

// MaxExtents is the most descriptors one EXTENTS carries (it fits
// MaxMessage).
const MaxExtents = (MaxMessage - ExtentsFixedLen) / ExtentLen

// Extent flags (the same bits as NBD's base:allocation context).
const (
	// ExtentHole: the range is not allocated in the store.
	ExtentHole uint32 = 0x1
	// ExtentZero: the range reads as zeros.
	ExtentZero       uint32 = 0x2
	extentFlagsKnown        = ExtentHole | ExtentZero
)

// Extents is a view of an EXTENTS (target to initiator): the answer to a
// BLOCK_STATUS, the allocation of the range from its offset on, as
// consecutive extents. They cover at least MinIO bytes and at most the
// range asked for; the initiator asks again for what is not covered.
type Extents []byte

// ExtentFields is one extent descriptor.
type ExtentFields struct {
	Length uint32 // bytes, a positive multiple of MinIO
	Flags  uint32 // ExtentHole, ExtentZero
}

// ExtentsFields are an EXTENTS' fields.
type ExtentsFields struct {
	Tag     uint32
	Grant   GrantFields // a new write grant (STag 0: none)
	Extents []ExtentFields
}

// Tag returns the tag of the BLOCK_STATUS answered.
func (m Extents) Tag() uint32 { return Header(m).Tag() }

// Grant returns the new write grant.
func (m Extents) Grant() Grant { return Grant(m[8:24]) }

// Count returns the number of descriptors.
func (m Extents) Count() int { return int(binary.BigEndian.Uint32(m[24:28])) }

// Extent returns descriptor i.
func (m Extents) Extent(i int) ExtentFields {
	d := m[ExtentsFixedLen+i*ExtentLen:]
	return ExtentFields{Length: binary.BigEndian.Uint32(d[0:4]), Flags: binary.BigEndian.Uint32(d[4:8])}
}

// Fields returns the EXTENTS' fields.
func (m Extents) Fields() ExtentsFields {
	f := ExtentsFields{Tag: m.Tag(), Grant: m.Grant().Fields(), Extents: make([]ExtentFields, m.Count())}
	for i := range f.Extents {
		f.Extents[i] = m.Extent(i)
	}
	return f
}

// ExtentsLen is the encoded length of an EXTENTS of n descriptors.
func ExtentsLen(n int) int { return ExtentsFixedLen + n*ExtentLen }

// EncodeExtents writes an EXTENTS into b.
func EncodeExtents(b []byte, f *ExtentsFields) (Extents, error) {
	n := len(f.Extents)
	if n == 0 || n > MaxExtents {
		return nil, errorf(ErrField, "EXTENTS of %d descriptors, want 1-%d", n, MaxExtents)
	}
	if len(b) < ExtentsLen(n) {
		return nil, errorf(ErrShort, "buffer of %d bytes for a %d-byte EXTENTS", len(b), ExtentsLen(n))
	}
	m := Extents(b[:ExtentsLen(n)])
	Header(m).Encode(&HeaderFields{Opcode: OpExtents, Tag: f.Tag})
	m.Grant().Encode(&f.Grant)
	binary.BigEndian.PutUint32(m[24:28], uint32(n))
	clear(m[28:32])
	for i, e := range f.Extents {
		d := m[ExtentsFixedLen+i*ExtentLen:]
		binary.BigEndian.PutUint32(d[0:4], e.Length)
		binary.BigEndian.PutUint32(d[4:8], e.Flags)
	}
	return m, nil
}

// ParseExtents checks an EXTENTS: flags, reserved bytes, 1..MaxExtents
// descriptors that the message's length matches, each of a positive
// length that is a multiple of minIO with known flags, their sum without
// overflow, and the grant. That the extents lie inside the range asked for
// is the initiator's to check.
func ParseExtents(b []byte, minIO uint32) (Extents, error) {
	if err := expect(b, OpExtents, ExtentsFixedLen, 0); err != nil {
		return nil, err
	}
	m := Extents(b)
	n := m.Count()
	if n == 0 || n > MaxExtents {
		return nil, errorf(ErrField, "EXTENTS of %d descriptors, want 1-%d", n, MaxExtents)
	}
	if len(b) != ExtentsLen(n) {
		return nil, errorf(ErrLength, "EXTENTS of %d bytes, %d descriptors take %d", len(b), n, ExtentsLen(n))
	}
	if !zero(m[28:32]) {
		return nil, errorf(ErrReserved, "EXTENTS reserved bytes 28-31 not zero")
	}
	var total uint64
	for i := range n {
		e := m.Extent(i)
		if e.Length == 0 || minIO == 0 || e.Length%minIO != 0 {
			return nil, errorf(ErrField, "EXTENTS descriptor %d of %d bytes, not a positive multiple of %d", i, e.Length, minIO)
		}
		if e.Flags&^extentFlagsKnown != 0 {
			return nil, errorf(ErrFlags, "EXTENTS descriptor %d with unknown flags 0x%x", i, e.Flags)
		}
		total += uint64(e.Length)
	}
	if total > 1<<32-1 {
		return nil, errorf(ErrField, "EXTENTS covering %d bytes, more than a BLOCK_STATUS asks", total)
	}
	if err := m.Grant().check("EXTENTS grant"); err != nil {
		return nil, err
	}
	return m, nil
}
