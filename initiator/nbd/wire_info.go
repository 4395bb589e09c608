package nbd

import (
	"encoding/binary"
	"fmt"
)

// InfoRequest is the data of NBD_OPT_INFO and NBD_OPT_GO:
//
//	u32 name length, name, u16 number of requests, that many u16 NBD_INFO_* types
type InfoRequest struct {
	Name  string
	Infos []uint16
}

// Wants reports whether the client asked for information type t.
func (r InfoRequest) Wants(t uint16) bool {
	for _, v := range r.Infos {
		if v == t {
			return true
		}
	}
	return false
}

// AppendInfoRequest appends the wire form of r to dst.
func AppendInfoRequest(dst []byte, r InfoRequest) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(r.Name)))
	dst = append(dst, r.Name...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.Infos)))
	for _, t := range r.Infos {
		dst = binary.BigEndian.AppendUint16(dst, t)
	}
	return dst
}

// ParseInfoRequest decodes the data of an NBD_OPT_INFO or NBD_OPT_GO
// option. It fails with an error wrapping ErrMalformed unless the lengths
// add up exactly and the name is at most 4096 bytes.
func ParseInfoRequest(data []byte) (InfoRequest, error) {
	if len(data) < 6 {
		return InfoRequest{}, fmt.Errorf("%w: info request of %d bytes, need at least 6", ErrMalformed, len(data))
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n) > uint64(len(data)-6) {
		return InfoRequest{}, fmt.Errorf("%w: export name length %d exceeds option data (%d bytes)", ErrMalformed, n, len(data))
	}
	if n > maxString {
		return InfoRequest{}, fmt.Errorf("%w: export name of %d bytes exceeds %d", ErrMalformed, n, maxString)
	}
	r := InfoRequest{Name: string(data[4 : 4+n])}
	rest := data[4+n:]
	count := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*count {
		return InfoRequest{}, fmt.Errorf("%w: %d information requests need %d bytes, have %d", ErrMalformed, count, 2*count, len(rest))
	}
	if count > 0 {
		r.Infos = make([]uint16, count)
		for i := range r.Infos {
			r.Infos[i] = binary.BigEndian.Uint16(rest[2*i:])
		}
	}
	return r, nil
}
