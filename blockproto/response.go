package blockproto

import (
	"encoding/binary"
	"unicode/utf8"
)

// ResponseFixedLen is the length of a RESPONSE, REJECT or GOODBYE before
// its detail text.
const ResponseFixedLen = 40

// Response is a view of a RESPONSE (the completion of a command), a REJECT
// (a login refused) or a GOODBYE (the target ends the session): the three
// share one layout.
type Response []byte

// ResponseFields are a response's fields.
type ResponseFields struct {
	Op     Opcode // OpResponse, OpReject or OpGoodbye
	Tag    uint32 // RESPONSE: the command's tag; otherwise 0
	Status Status
	Value  uint64      // status-specific (see the package documentation)
	Grant  GrantFields // RESPONSE: a new write grant (STag 0: none)
	Detail string      // human-readable, at most MaxName bytes
}

// Op returns the opcode.
func (m Response) Op() Opcode { return Header(m).Opcode() }

// Tag returns the tag of the command answered.
func (m Response) Tag() uint32 { return Header(m).Tag() }

// Status returns the status.
func (m Response) Status() Status { return Status(binary.BigEndian.Uint16(m[8:10])) }

func (m Response) detailLen() int { return int(m[10]) }

// Value returns the status-specific value.
func (m Response) Value() uint64 { return binary.BigEndian.Uint64(m[16:24]) }

// Grant returns the grant descriptor.
func (m Response) Grant() Grant { return Grant(m[24:40]) }

// Detail returns the detail text.
func (m Response) Detail() []byte { return m[ResponseFixedLen : ResponseFixedLen+m.detailLen()] }

// ResponseLen is the encoded length of f (its detail truncated to
// MaxName bytes).
func ResponseLen(f *ResponseFields) int { return ResponseFixedLen + min(len(f.Detail), MaxName) }

// EncodeResponse writes a response into b (at least ResponseLen(f)
// bytes). A detail longer than MaxName bytes is cut at a UTF-8 boundary;
// control characters in it become '?'.
func EncodeResponse(b []byte, f *ResponseFields) (Response, error) {
	if f.Op != OpResponse && f.Op != OpReject && f.Op != OpGoodbye {
		return nil, errorf(ErrOpcode, "%s is not a response", f.Op)
	}
	d := f.Detail
	if len(d) > MaxName {
		d = d[:MaxName]
		for i := 0; i < utf8.UTFMax-1 && !utf8.ValidString(d); i++ {
			d = d[:len(d)-1] // do not cut a character in two
		}
	}
	n := ResponseFixedLen + len(d)
	if len(b) < n {
		return nil, errorf(ErrShort, "buffer of %d bytes for a %d-byte %s", len(b), n, f.Op)
	}
	m := Response(b[:n])
	Header(m).Encode(&HeaderFields{Opcode: f.Op, Tag: f.Tag})
	binary.BigEndian.PutUint16(m[8:10], uint16(f.Status))
	m[10] = uint8(len(d))
	clear(m[11:16])
	binary.BigEndian.PutUint64(m[16:24], f.Value)
	m.Grant().Encode(&f.Grant)
	copy(m[ResponseFixedLen:], d)
	sanitize(m[ResponseFixedLen:])
	return m, nil
}

// sanitize replaces control characters and invalid UTF-8 by '?'.
func sanitize(b []byte) {
	if validText(b) {
		return
	}
	for i := range b {
		if b[i] < 0x20 || b[i] >= 0x7f {
			b[i] = '?'
		}
	}
}

// Fields returns the response's fields.
func (m Response) Fields() ResponseFields {
	return ResponseFields{Op: m.Op(), Tag: m.Tag(), Status: m.Status(), Value: m.Value(), Grant: m.Grant().Fields(),
		Detail: string(m.Detail())}
}

// ParseResponse checks a RESPONSE, REJECT or GOODBYE: length, flags,
// reserved bytes, a status this version defines, the grant, the detail
// text; a REJECT or GOODBYE has tag 0, no grant and a status other than
// StatusOK.
func ParseResponse(b []byte) (Response, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	op := h.Opcode()
	if op != OpResponse && op != OpReject && op != OpGoodbye {
		return nil, errorf(ErrOpcode, "%s where a response was expected", op)
	}
	if len(b) < ResponseFixedLen {
		return nil, errorf(ErrShort, "%s of %d bytes, shorter than its %d-byte fixed part", op, len(b), ResponseFixedLen)
	}
	if h.Flags() != 0 {
		return nil, errorf(ErrFlags, "%s with unknown flags 0x%04x", op, h.Flags())
	}
	m := Response(b)
	if n := ResponseFixedLen + m.detailLen(); len(b) != n {
		return nil, errorf(ErrLength, "%s of %d bytes, detail length says %d", op, len(b), n)
	}
	if !zero(b[11:16]) {
		return nil, errorf(ErrReserved, "%s reserved bytes 11-15 not zero", op)
	}
	if !m.Status().Known() {
		return nil, errorf(ErrField, "%s with unknown status %d", op, uint16(m.Status()))
	}
	what := "RESPONSE grant" // a constant: decoding allocates nothing
	switch op {
	case OpReject:
		what = "REJECT grant"
	case OpGoodbye:
		what = "GOODBYE grant"
	}
	if err := m.Grant().check(what); err != nil {
		return nil, err
	}
	if !validText(m.Detail()) {
		return nil, errorf(ErrField, "%s detail is not printable UTF-8", op)
	}
	if op != OpResponse {
		if h.Tag() != 0 || m.Grant().STag() != 0 || m.Status() == StatusOK {
			return nil, errorf(ErrField, "%s with a tag, a grant or status ok", op)
		}
	}
	return m, nil
}

// ReadyLen is the length of a READY.
const ReadyLen = 40

// Ready is a view of a READY (target to initiator): the buffer of a READ
// is filled, or the buffer of a WRITE_REQ is waiting for the data.
type Ready []byte

// ReadyFields are a READY's fields.
type ReadyFields struct {
	Tag    uint32
	Buffer GrantFields // the request's buffer
	Grant  GrantFields // a new write grant (STag 0: none)
}

// Tag returns the tag of the command answered.
func (m Ready) Tag() uint32 { return Header(m).Tag() }

// Buffer returns the request's buffer.
func (m Ready) Buffer() Grant { return Grant(m[8:24]) }

// Grant returns the new write grant.
func (m Ready) Grant() Grant { return Grant(m[24:40]) }

// EncodeReady writes a READY into b.
func EncodeReady(b []byte, f *ReadyFields) Ready {
	m := Ready(b[:ReadyLen])
	Header(m).Encode(&HeaderFields{Opcode: OpReady, Tag: f.Tag})
	m.Buffer().Encode(&f.Buffer)
	m.Grant().Encode(&f.Grant)
	return m
}

// Fields returns the READY's fields.
func (m Ready) Fields() ReadyFields {
	return ReadyFields{Tag: m.Tag(), Buffer: m.Buffer().Fields(), Grant: m.Grant().Fields()}
}

// ParseReady checks a READY: length, flags, a buffer with an STag, the
// grant.
func ParseReady(b []byte) (Ready, error) {
	if err := expect(b, OpReady, ReadyLen, 0); err != nil {
		return nil, err
	}
	if len(b) != ReadyLen {
		return nil, errorf(ErrLength, "READY of %d bytes, want %d", len(b), ReadyLen)
	}
	m := Ready(b)
	if m.Buffer().STag() == 0 {
		return nil, errorf(ErrField, "READY without a buffer")
	}
	if err := m.Buffer().check("READY buffer"); err != nil {
		return nil, err
	}
	if err := m.Grant().check("READY grant"); err != nil {
		return nil, err
	}
	return m, nil
}
