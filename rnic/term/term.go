// Package term holds the RFC 5040 §7 Terminate classification: the Layer,
// Error Type and Error Code triple that every protocol check failure maps to,
// and the typed error that carries it from the wire decoders (mpa, ddp, rdmap)
// up to the engine, which turns it into a Terminate message.
//
// The values come from RFC 5040 §4.8 (RDMAP), RFC 5041 (DDP) and RFC 5044
// §8 and RFC 6581 (MPA); those of DDP and MPA were confirmed from Wireshark
// and Linux siw.
package term

import "fmt"

// Layer is the high nibble of the Terminate control byte 0.
type Layer uint8

const (
	LayerRDMAP Layer = 0 // RDMAP (RFC 5040)
	LayerDDP   Layer = 1 // DDP (RFC 5041)
	LayerLLP   Layer = 2 // lower layer protocol: MPA (RFC 5044)
)

func (l Layer) String() string {
	switch l {
	case LayerRDMAP:
		return "RDMAP"
	case LayerDDP:
		return "DDP"
	case LayerLLP:
		return "LLP"
	}
	return fmt.Sprintf("layer(%d)", uint8(l))
}

// EType is the low nibble of Terminate byte 0; its meaning depends on the Layer.
type EType uint8

// RDMAP error types (Layer 0).
const (
	RDMALocalCatastrophic EType = 0x0
	RDMARemoteProtection  EType = 0x1
	RDMARemoteOperation   EType = 0x2
)

// DDP error types (Layer 1).
const (
	DDPLocalCatastrophic EType = 0x0
	DDPTagged            EType = 0x1
	DDPUntagged          EType = 0x2
)

// LLP error type (Layer 2): MPA is the only one.
const LLPMPA EType = 0x0

// Code is Terminate byte 1.
type Code uint8

// RDMAP Remote Protection codes (Layer 0, EType 1).
const (
	ProtInvalidSTag        Code = 0x00
	ProtBaseBounds         Code = 0x01
	ProtAccessRights       Code = 0x02
	ProtSTagNotAssociated  Code = 0x03
	ProtTOWrap             Code = 0x04
	ProtCannotInvalidate   Code = 0x09
	ProtUnspecified        Code = 0xFF
	OpInvalidVersion       Code = 0x05 // Remote Operation (EType 2)
	OpUnexpectedOpcode     Code = 0x06
	OpCatastrophicStream   Code = 0x07
	OpCatastrophicGlobal   Code = 0x08
	OpCannotInvalidate     Code = 0x09
	OpUnspecified          Code = 0xFF
	TaggedInvalidSTag      Code = 0x00 // DDP Tagged (Layer 1, EType 1)
	TaggedBaseBounds       Code = 0x01
	TaggedNotAssociated    Code = 0x02
	TaggedTOWrap           Code = 0x03
	TaggedInvalidVersion   Code = 0x04
	UntaggedInvalidQN      Code = 0x01 // DDP Untagged (Layer 1, EType 2)
	UntaggedNoBuffer       Code = 0x02
	UntaggedMSNRange       Code = 0x03
	UntaggedInvalidMO      Code = 0x04
	UntaggedTooLong        Code = 0x05
	UntaggedInvalidVersion Code = 0x06
	MPAConnLost            Code = 0x01 // LLP / MPA (Layer 2, EType 0)
	MPACRC                 Code = 0x02
	MPAMarker              Code = 0x03
	MPAInvalidFrame        Code = 0x04
	MPALocalCatastrophic   Code = 0x05
	MPAInsufficientIRD     Code = 0x06
	MPANoMatchingRTR       Code = 0x07
)

// Cause is one Terminate classification: what the engine puts in the first two
// bytes of a Terminate header.
type Cause struct {
	Layer Layer
	EType EType
	Code  Code
}

// Byte0 returns the Layer<<4|EType byte of the Terminate control field.
func (c Cause) Byte0() byte { return byte(c.Layer)<<4 | byte(c.EType)&0x0F }

// FromBytes decodes the first two bytes of a Terminate control field.
func FromBytes(b0, b1 byte) Cause {
	return Cause{Layer: Layer(b0 >> 4), EType: EType(b0 & 0x0F), Code: Code(b1)}
}

// String renders the triple as "Layer/EType/0xCode name".
func (c Cause) String() string {
	return fmt.Sprintf("%s/%d/0x%02X %s", c.Layer, c.EType, uint8(c.Code), c.Name())
}

// Name is the RFC's name for the cause, or "unknown".
func (c Cause) Name() string {
	if n, ok := codeless[kind{c.Layer, c.EType}]; ok {
		return n
	}
	if n, ok := names[c]; ok {
		return n
	}
	return "unknown"
}

type kind struct {
	Layer Layer
	EType EType
}

// codeless names the error types that have no code: any code value is
// acceptable (RFC 5040 Figure 9).
var codeless = map[kind]string{
	{LayerRDMAP, RDMALocalCatastrophic}: "local catastrophic error",
	{LayerDDP, DDPLocalCatastrophic}:    "DDP local catastrophic error",
}

// names are the RFCs' names of the causes with a code (RFC 5040 Figure 9,
// DDP's Tagged and Untagged Buffer errors, MPA's and RFC 6581's errors).
var names = map[Cause]string{
	{LayerRDMAP, RDMARemoteProtection, ProtInvalidSTag}:       "invalid STag",
	{LayerRDMAP, RDMARemoteProtection, ProtBaseBounds}:        "base or bounds violation",
	{LayerRDMAP, RDMARemoteProtection, ProtAccessRights}:      "access rights violation",
	{LayerRDMAP, RDMARemoteProtection, ProtSTagNotAssociated}: "STag not associated with RDMAP stream",
	{LayerRDMAP, RDMARemoteProtection, ProtTOWrap}:            "TO wrap",
	{LayerRDMAP, RDMARemoteProtection, ProtCannotInvalidate}:  "STag cannot be invalidated",
	{LayerRDMAP, RDMARemoteProtection, ProtUnspecified}:       "unspecified protection error",

	{LayerRDMAP, RDMARemoteOperation, OpInvalidVersion}:     "invalid RDMAP version",
	{LayerRDMAP, RDMARemoteOperation, OpUnexpectedOpcode}:   "unexpected opcode",
	{LayerRDMAP, RDMARemoteOperation, OpCatastrophicStream}: "catastrophic error, localized to RDMAP stream",
	{LayerRDMAP, RDMARemoteOperation, OpCatastrophicGlobal}: "catastrophic error, global",
	{LayerRDMAP, RDMARemoteOperation, OpCannotInvalidate}:   "STag cannot be invalidated",
	{LayerRDMAP, RDMARemoteOperation, OpUnspecified}:        "unspecified remote operation error",

	{LayerDDP, DDPTagged, TaggedInvalidSTag}:    "invalid STag",
	{LayerDDP, DDPTagged, TaggedBaseBounds}:     "base or bounds violation",
	{LayerDDP, DDPTagged, TaggedNotAssociated}:  "STag not associated with DDP stream",
	{LayerDDP, DDPTagged, TaggedTOWrap}:         "TO wrap",
	{LayerDDP, DDPTagged, TaggedInvalidVersion}: "invalid DDP version",

	{LayerDDP, DDPUntagged, UntaggedInvalidQN}:      "invalid QN",
	{LayerDDP, DDPUntagged, UntaggedNoBuffer}:       "invalid MSN - no buffer available",
	{LayerDDP, DDPUntagged, UntaggedMSNRange}:       "invalid MSN - MSN range is not valid",
	{LayerDDP, DDPUntagged, UntaggedInvalidMO}:      "invalid MO",
	{LayerDDP, DDPUntagged, UntaggedTooLong}:        "DDP message too long for available buffer",
	{LayerDDP, DDPUntagged, UntaggedInvalidVersion}: "invalid DDP version",

	{LayerLLP, LLPMPA, MPAConnLost}:          "TCP connection closed, terminated or lost",
	{LayerLLP, LLPMPA, MPACRC}:               "MPA CRC error",
	{LayerLLP, LLPMPA, MPAMarker}:            "MPA marker and ULPDU length mismatch",
	{LayerLLP, LLPMPA, MPAInvalidFrame}:      "invalid MPA request or reply frame",
	{LayerLLP, LLPMPA, MPALocalCatastrophic}: "MPA local catastrophic error",
	{LayerLLP, LLPMPA, MPAInsufficientIRD}:   "insufficient IRD resources",
	{LayerLLP, LLPMPA, MPANoMatchingRTR}:     "no matching RTR option",
}

// Error is a protocol check failure. It carries the Terminate cause the engine
// must send, and a human-readable detail. Decoders return *Error so that
// callers can use errors.As to recover the cause.
type Error struct {
	Cause  Cause
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "terminate " + e.Cause.String()
	}
	return "terminate " + e.Cause.String() + ": " + e.Detail
}

// Errorf builds an *Error for the given cause.
func Errorf(layer Layer, etype EType, code Code, format string, args ...any) *Error {
	return &Error{Cause: Cause{Layer: layer, EType: etype, Code: code}, Detail: fmt.Sprintf(format, args...)}
}
