package nbd

import (
	"encoding/binary"
	"fmt"
)

// MetaContextRequest is the data of an NBD_OPT_LIST_META_CONTEXT or
// NBD_OPT_SET_META_CONTEXT option:
//
//	0      export name length n  u32
//	4      export name           [n]
//	4+n    query count q         u32
//	8+n    q queries, each a u32 length then the query string
type MetaContextRequest struct {
	Name    string
	Queries []string
}

// maxMetaQueries bounds the queries of one option the server accepts.
const maxMetaQueries = 64

// ParseMetaContextRequest decodes the data of a meta context option. It
// fails with an error wrapping ErrMalformed unless the lengths add up
// exactly, the name and every query are at most 4096 bytes, and there are
// at most 64 queries.
func ParseMetaContextRequest(data []byte) (MetaContextRequest, error) {
	var r MetaContextRequest
	str := func(what string) (string, error) {
		if len(data) < 4 {
			return "", fmt.Errorf("%w: meta context option ends before the %s length", ErrMalformed, what)
		}
		n := binary.BigEndian.Uint32(data)
		data = data[4:]
		if n > maxString {
			return "", fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrMalformed, what, n, maxString)
		}
		if uint64(n) > uint64(len(data)) {
			return "", fmt.Errorf("%w: %s length %d exceeds the option data left (%d bytes)", ErrMalformed, what, n, len(data))
		}
		s := string(data[:n])
		data = data[n:]
		return s, nil
	}
	var err error
	if r.Name, err = str("export name"); err != nil {
		return MetaContextRequest{}, err
	}
	if len(data) < 4 {
		return MetaContextRequest{}, fmt.Errorf("%w: meta context option ends before the query count", ErrMalformed)
	}
	q := binary.BigEndian.Uint32(data)
	data = data[4:]
	if q > maxMetaQueries {
		return MetaContextRequest{}, fmt.Errorf("%w: %d queries, at most %d", ErrMalformed, q, maxMetaQueries)
	}
	for range q {
		s, err := str("query")
		if err != nil {
			return MetaContextRequest{}, err
		}
		r.Queries = append(r.Queries, s)
	}
	if len(data) != 0 {
		return MetaContextRequest{}, fmt.Errorf("%w: %d bytes after the queries", ErrMalformed, len(data))
	}
	return r, nil
}

// AppendMetaContextRequest appends the encoding of r to b.
func AppendMetaContextRequest(b []byte, r MetaContextRequest) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Name)))
	b = append(b, r.Name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Queries)))
	for _, q := range r.Queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}
