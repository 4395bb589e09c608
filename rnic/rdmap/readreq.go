package rdmap

import (
	"encoding/binary"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Fixed RDMAP header sizes (the bytes after the DDP header).
const (
	ReadRequestLen    = 28 // RFC 5040 §4.4
	AtomicRequestLen  = 52 // RFC 7306 Figure 4
	AtomicResponseLen = 12 // RFC 7306 Figure 6 (not the "32 bytes" of its §4)
	ImmediateLen      = 8  // RFC 7306 §6.2
	TerminateMinLen   = 4  // control word only
	TerminateMaxLen   = 4 + 2 + 18 + 28
)

// ReadRequest is a view of an RDMA Read Request header (ReadRequestLen bytes).
type ReadRequest []byte

// ReadRequestFields holds the fields of a Read Request header.
type ReadRequestFields struct {
	SinkSTag uint32 // copied into the Read Response's DDP STag
	SinkTO   uint64 // copied into the Read Response's DDP TO
	Size     uint32 // RDMARDSZ, octets to read
	SrcSTag  uint32
	SrcTO    uint64
}

func (r ReadRequest) SinkSTag() uint32 { return binary.BigEndian.Uint32(r[0:4]) }
func (r ReadRequest) SinkTO() uint64   { return binary.BigEndian.Uint64(r[4:12]) }
func (r ReadRequest) Size() uint32     { return binary.BigEndian.Uint32(r[12:16]) }
func (r ReadRequest) SrcSTag() uint32  { return binary.BigEndian.Uint32(r[16:20]) }
func (r ReadRequest) SrcTO() uint64    { return binary.BigEndian.Uint64(r[20:28]) }

func (r ReadRequest) SetSinkSTag(v uint32) { binary.BigEndian.PutUint32(r[0:4], v) }
func (r ReadRequest) SetSinkTO(v uint64)   { binary.BigEndian.PutUint64(r[4:12], v) }
func (r ReadRequest) SetSize(v uint32)     { binary.BigEndian.PutUint32(r[12:16], v) }
func (r ReadRequest) SetSrcSTag(v uint32)  { binary.BigEndian.PutUint32(r[16:20], v) }
func (r ReadRequest) SetSrcTO(v uint64)    { binary.BigEndian.PutUint64(r[20:28], v) }

// Encode writes every field.
func (r ReadRequest) Encode(f *ReadRequestFields) {
	_ = r[ReadRequestLen-1]
	r.SetSinkSTag(f.SinkSTag)
	r.SetSinkTO(f.SinkTO)
	r.SetSize(f.Size)
	r.SetSrcSTag(f.SrcSTag)
	r.SetSrcTO(f.SrcTO)
}

// Fields returns the header's fields.
func (r ReadRequest) Fields() ReadRequestFields {
	return ReadRequestFields{SinkSTag: r.SinkSTag(), SinkTO: r.SinkTO(), Size: r.Size(),
		SrcSTag: r.SrcSTag(), SrcTO: r.SrcTO()}
}

// ParseReadRequest checks that b (the RDMA Read Request message after its
// DDP header) is exactly ReadRequestLen bytes: a Read Request carries no ULP
// payload. Otherwise it is RDMA / Remote Operation / Unspecified (0/2/0xFF).
// Every field value is legal on the wire; STag and bounds checks (only when
// Size > 0) are the responder's.
func ParseReadRequest(b []byte) (ReadRequest, error) {
	if len(b) != ReadRequestLen {
		return nil, lengthError(OpReadRequest, len(b), ReadRequestLen)
	}
	return ReadRequest(b[:ReadRequestLen:ReadRequestLen]), nil
}

func lengthError(op Opcode, got, want int) *term.Error {
	return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified,
		"%v of %d bytes after the DDP header, want exactly %d", op, got, want)
}
