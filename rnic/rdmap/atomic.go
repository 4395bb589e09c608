package rdmap

import (
	"encoding/binary"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Atomic operation codes (RFC 7306 Figure 5, §10.2). 0x1 is reserved and
// 0x3..0xF are unassigned; there is no separate Swap code (an unconditional
// swap is CmpSwap with Compare Mask 0 and Swap Mask all ones).
const (
	AtomicFetchAdd = 0x0
	AtomicCmpSwap  = 0x2
)

// AtomicRequest is a view of an Atomic Request header (AtomicRequestLen bytes).
type AtomicRequest []byte

// AtomicRequestFields holds the fields of an Atomic Request header.
type AtomicRequestFields struct {
	AOpcode     uint8 // AtomicFetchAdd or AtomicCmpSwap
	ReqID       uint32
	STag        uint32
	TO          uint64 // must address a 64-bit aligned word (checked by the responder)
	AddSwap     uint64 // FetchAdd: Add Data; CmpSwap: Swap Data
	AddSwapMask uint64 // FetchAdd: Add Mask (field MSBs); CmpSwap: Swap Mask
	Compare     uint64 // CmpSwap only (0 for FetchAdd)
	CompareMask uint64 // CmpSwap only (all ones for FetchAdd)
}

// AOpcode returns the atomic operation code: the low nibble of byte 3. The
// 28 bits before it are reserved (zero on transmit, ignored on receive).
func (a AtomicRequest) AOpcode() uint8      { return a[3] & 0x0F }
func (a AtomicRequest) ReqID() uint32       { return binary.BigEndian.Uint32(a[4:8]) }
func (a AtomicRequest) STag() uint32        { return binary.BigEndian.Uint32(a[8:12]) }
func (a AtomicRequest) TO() uint64          { return binary.BigEndian.Uint64(a[12:20]) }
func (a AtomicRequest) AddSwap() uint64     { return binary.BigEndian.Uint64(a[20:28]) }
func (a AtomicRequest) AddSwapMask() uint64 { return binary.BigEndian.Uint64(a[28:36]) }
func (a AtomicRequest) Compare() uint64     { return binary.BigEndian.Uint64(a[36:44]) }
func (a AtomicRequest) CompareMask() uint64 { return binary.BigEndian.Uint64(a[44:52]) }
func (a AtomicRequest) SetReqID(v uint32)   { binary.BigEndian.PutUint32(a[4:8], v) }
func (a AtomicRequest) SetSTag(v uint32)    { binary.BigEndian.PutUint32(a[8:12], v) }
func (a AtomicRequest) SetTO(v uint64)      { binary.BigEndian.PutUint64(a[12:20], v) }
func (a AtomicRequest) SetAddSwap(v uint64) { binary.BigEndian.PutUint64(a[20:28], v) }
func (a AtomicRequest) SetAddSwapMask(v uint64) {
	binary.BigEndian.PutUint64(a[28:36], v)
}
func (a AtomicRequest) SetCompare(v uint64)     { binary.BigEndian.PutUint64(a[36:44], v) }
func (a AtomicRequest) SetCompareMask(v uint64) { binary.BigEndian.PutUint64(a[44:52], v) }

// SetAOpcode writes the atomic operation code and zeroes the reserved bits.
func (a AtomicRequest) SetAOpcode(v uint8) {
	a[0], a[1], a[2] = 0, 0, 0
	a[3] = v & 0x0F
}

// Encode writes every field, reserved bits zero.
func (a AtomicRequest) Encode(f *AtomicRequestFields) {
	_ = a[AtomicRequestLen-1]
	a.SetAOpcode(f.AOpcode)
	a.SetReqID(f.ReqID)
	a.SetSTag(f.STag)
	a.SetTO(f.TO)
	a.SetAddSwap(f.AddSwap)
	a.SetAddSwapMask(f.AddSwapMask)
	a.SetCompare(f.Compare)
	a.SetCompareMask(f.CompareMask)
}

// Fields returns the header's fields.
func (a AtomicRequest) Fields() AtomicRequestFields {
	return AtomicRequestFields{AOpcode: a.AOpcode(), ReqID: a.ReqID(), STag: a.STag(), TO: a.TO(),
		AddSwap: a.AddSwap(), AddSwapMask: a.AddSwapMask(), Compare: a.Compare(), CompareMask: a.CompareMask()}
}

// ParseAtomicRequest checks an Atomic Request message after its DDP header:
// exactly AtomicRequestLen bytes (else 0/2/0xFF) and a supported AOpcode
// (else RDMA / Remote Operation / Unexpected OpCode, 0/2/0x06, RFC 7306
// §5.2.1 item 4). Alignment and STag checks are the responder's.
func ParseAtomicRequest(b []byte) (AtomicRequest, error) {
	if len(b) != AtomicRequestLen {
		return nil, lengthError(OpAtomicRequest, len(b), AtomicRequestLen)
	}
	a := AtomicRequest(b[:AtomicRequestLen:AtomicRequestLen])
	switch op := a.AOpcode(); op {
	case AtomicFetchAdd, AtomicCmpSwap:
		return a, nil
	default:
		return nil, term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"unsupported atomic operation code 0x%X", op)
	}
}

// AtomicResponse is a view of an Atomic Response header (AtomicResponseLen bytes).
type AtomicResponse []byte

// AtomicResponseFields holds the fields of an Atomic Response header.
type AtomicResponseFields struct {
	ReqID    uint32 // the request's Request Identifier
	Original uint64 // the target word before the operation
}

func (a AtomicResponse) ReqID() uint32        { return binary.BigEndian.Uint32(a[0:4]) }
func (a AtomicResponse) Original() uint64     { return binary.BigEndian.Uint64(a[4:12]) }
func (a AtomicResponse) SetReqID(v uint32)    { binary.BigEndian.PutUint32(a[0:4], v) }
func (a AtomicResponse) SetOriginal(v uint64) { binary.BigEndian.PutUint64(a[4:12], v) }

// Encode writes every field.
func (a AtomicResponse) Encode(f *AtomicResponseFields) {
	_ = a[AtomicResponseLen-1]
	a.SetReqID(f.ReqID)
	a.SetOriginal(f.Original)
}

// Fields returns the header's fields.
func (a AtomicResponse) Fields() AtomicResponseFields {
	return AtomicResponseFields{ReqID: a.ReqID(), Original: a.Original()}
}

// ParseAtomicResponse checks that b is exactly AtomicResponseLen bytes (else
// 0/2/0xFF). Matching it to an outstanding request is the engine's job.
func ParseAtomicResponse(b []byte) (AtomicResponse, error) {
	if len(b) != AtomicResponseLen {
		return nil, lengthError(OpAtomicResponse, len(b), AtomicResponseLen)
	}
	return AtomicResponse(b[:AtomicResponseLen:AtomicResponseLen]), nil
}

// FetchAdd returns the new value of a word holding orig after a masked
// FetchAdd of add (RFC 7306 §5.1.1): each 1 bit of mask marks the most
// significant bit of a field, and the carry out of that bit is dropped. A
// zero mask is one 64-bit add (carry out of bit 63 dropped).
func FetchAdd(orig, add, mask uint64) uint64 {
	// Add with the field MSBs cleared so no carry crosses a field boundary,
	// then put each MSB back as the XOR of the two MSBs and the carry into it.
	sum := (orig &^ mask) + (add &^ mask)
	return sum ^ ((orig ^ add) & mask)
}

// CmpSwap returns the new value of a word holding orig after a masked
// CmpSwap (RFC 7306 §5.1.2): if orig equals cmp on the bits of cmpMask, the
// bits of swapMask are replaced by those of swap; otherwise orig is returned
// unchanged.
func CmpSwap(orig, swap, swapMask, cmp, cmpMask uint64) uint64 {
	if (cmp^orig)&cmpMask != 0 {
		return orig
	}
	return orig&^swapMask | swap&swapMask
}
