package blockproto

import "encoding/binary"

// DataFixedLen is the length of a DATA before its data.
const DataFixedLen = 32

// MinInlineUnit is what inline sizes in LOGIN are multiples of (the
// protocol's smallest min I/O).
const MinInlineUnit = 512

// validInline reports whether v is a positive multiple of unit up to
// MaxInline.
func validInline(v uint32, unit uint64) bool {
	return v > 0 && v <= MaxInline && unit > 0 && uint64(v)%unit == 0
}

// Data is a view of a DATA (target to initiator): the answer to a READ with
// FlagInline, carrying the data.
type Data []byte

// DataFields are a DATA's fields besides the data itself.
type DataFields struct {
	Tag   uint32
	Grant GrantFields // a new write grant (STag 0: none)
	Len   uint32      // bytes of data, 1..MaxInline
}

// Tag returns the tag of the READ answered.
func (m Data) Tag() uint32 { return Header(m).Tag() }

// Grant returns the new write grant.
func (m Data) Grant() Grant { return Grant(m[8:24]) }

// Len returns the length of the data.
func (m Data) Len() uint32 { return binary.BigEndian.Uint32(m[24:28]) }

// Payload returns the data.
func (m Data) Payload() []byte { return m[DataFixedLen : DataFixedLen+int(m.Len())] }

// DataLen is the encoded length of a DATA carrying n bytes.
func DataLen(n int) int { return DataFixedLen + n }

// EncodeData writes the fixed part of a DATA carrying f.Len bytes into b
// and returns the message, b[:DataLen(f.Len)]. It does not touch the data
// area (Payload), which the caller fills before or after.
func EncodeData(b []byte, f *DataFields) (Data, error) {
	if f.Len == 0 || f.Len > MaxInline {
		return nil, errorf(ErrField, "DATA of %d bytes, want 1-%d", f.Len, MaxInline)
	}
	n := DataLen(int(f.Len))
	if len(b) < n {
		return nil, errorf(ErrShort, "buffer of %d bytes for a %d-byte DATA", len(b), n)
	}
	m := Data(b[:n])
	Header(m).Encode(&HeaderFields{Opcode: OpData, Tag: f.Tag})
	m.Grant().Encode(&f.Grant)
	binary.BigEndian.PutUint32(m[24:28], f.Len)
	clear(m[28:32])
	return m, nil
}

// Fields returns the DATA's fields.
func (m Data) Fields() DataFields {
	return DataFields{Tag: m.Tag(), Grant: m.Grant().Fields(), Len: m.Len()}
}

// ParseData checks a DATA: flags, reserved bytes, a length of 1..MaxInline
// that the message's length matches, the grant.
func ParseData(b []byte) (Data, error) {
	if err := expect(b, OpData, DataFixedLen, 0); err != nil {
		return nil, err
	}
	m := Data(b)
	if m.Len() == 0 || m.Len() > MaxInline {
		return nil, errorf(ErrField, "DATA of %d bytes, want 1-%d", m.Len(), MaxInline)
	}
	if n := DataLen(int(m.Len())); len(b) != n {
		return nil, errorf(ErrLength, "DATA of %d bytes, its length says %d", len(b), n)
	}
	if !zero(m[28:32]) {
		return nil, errorf(ErrReserved, "DATA reserved bytes 28-31 not zero")
	}
	if err := m.Grant().check("DATA grant"); err != nil {
		return nil, err
	}
	return m, nil
}
