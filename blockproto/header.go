package blockproto

import "encoding/binary"

// Version is the protocol version this package speaks.
const Version = 1

// HeaderLen is the length of the header every message starts with.
const HeaderLen = 8

// MaxMessage is the largest message either side sends, except DATA: every
// receive buffer is at least this long.
const MaxMessage = 1024

// MaxInline is the largest inline read: the most data a DATA carries. A
// DATA is at most DataFixedLen + MaxInline bytes; an initiator that asks
// for inline reads of up to n bytes posts receives of at least
// max(MaxMessage, DataFixedLen+n) bytes.
const MaxInline = 16384

// Opcode identifies a message.
type Opcode uint8

// Opcodes. The initiator sends Login, Proof and the commands (0x10..0x17);
// the target sends Challenge, Welcome, Reject, Response, Ready, Goodbye and
// Data.
const (
	OpLogin       Opcode = 0x01
	OpChallenge   Opcode = 0x02
	OpProof       Opcode = 0x03
	OpWelcome     Opcode = 0x04
	OpReject      Opcode = 0x05
	OpRead        Opcode = 0x10
	OpWrite       Opcode = 0x11
	OpFlush       Opcode = 0x12
	OpTrim        Opcode = 0x13
	OpWriteZeroes Opcode = 0x14
	OpWriteReq    Opcode = 0x15
	OpRelease     Opcode = 0x16
	OpHolder      Opcode = 0x17
	OpBlockStatus Opcode = 0x18
	OpResponse    Opcode = 0x20
	OpReady       Opcode = 0x21
	OpGoodbye     Opcode = 0x22
	OpData        Opcode = 0x23
	OpExtents     Opcode = 0x24
)

var opNames = map[Opcode]string{
	OpLogin: "LOGIN", OpChallenge: "CHALLENGE", OpProof: "PROOF", OpWelcome: "WELCOME", OpReject: "REJECT",
	OpRead: "READ", OpWrite: "WRITE", OpFlush: "FLUSH", OpTrim: "TRIM", OpWriteZeroes: "WRITE_ZEROES",
	OpWriteReq: "WRITE_REQ", OpRelease: "RELEASE", OpHolder: "HOLDER", OpBlockStatus: "BLOCK_STATUS",
	OpResponse: "RESPONSE", OpReady: "READY", OpGoodbye: "GOODBYE", OpData: "DATA", OpExtents: "EXTENTS",
}

func (o Opcode) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return "opcode(0x" + hex8(uint8(o)) + ")"
}

// IsCommand reports whether o is one of the initiator's commands, the
// messages that carry a request tag and use a credit.
func (o Opcode) IsCommand() bool { return o >= OpRead && o <= OpBlockStatus }

func hex8(v uint8) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[v>>4], digits[v&15]})
}

// Flags of the header.
const (
	// FlagFUA (WRITE, WRITE_ZEROES): the data is durable before the
	// response is sent.
	FlagFUA uint16 = 0x0001
	// FlagJoin (LOGIN): add a QP to an existing session.
	FlagJoin uint16 = 0x0001
	// FlagInline (LOGIN): the initiator takes inline reads up to the size
	// the LOGIN names; (WELCOME): the target answers them, up to the size
	// the WELCOME names; (READ): answer with DATA, the data inline.
	FlagInline uint16 = 0x0002
	// FlagExtents (LOGIN): the initiator may send BLOCK_STATUS and takes
	// EXTENTS; (WELCOME): the target answers BLOCK_STATUS.
	FlagExtents uint16 = 0x0004
	// FlagNoHole (LOGIN): the initiator may send WRITE_ZEROES with
	// FlagNoHole; (WELCOME): the target honours it; (WRITE_ZEROES): the
	// range stays allocated (NBD's NBD_CMD_FLAG_NO_HOLE).
	FlagNoHole uint16 = 0x0008
)

// Header is a view of the 8-byte header every message starts with.
type Header []byte

// HeaderFields are the header's fields.
type HeaderFields struct {
	Opcode Opcode
	Flags  uint16
	Tag    uint32
}

// Version returns the protocol version byte.
func (h Header) Version() uint8 { return h[0] }

// Opcode returns the message type.
func (h Header) Opcode() Opcode { return Opcode(h[1]) }

// Flags returns the flag bits.
func (h Header) Flags() uint16 { return binary.BigEndian.Uint16(h[2:4]) }

// Tag returns the request tag (commands and the target's answers to them).
func (h Header) Tag() uint32 { return binary.BigEndian.Uint32(h[4:8]) }

// SetFlags sets the flag bits.
func (h Header) SetFlags(v uint16) { binary.BigEndian.PutUint16(h[2:4], v) }

// SetTag sets the request tag.
func (h Header) SetTag(v uint32) { binary.BigEndian.PutUint32(h[4:8], v) }

// Encode writes the header with the current Version.
func (h Header) Encode(f *HeaderFields) {
	_ = h[HeaderLen-1]
	h[0] = Version
	h[1] = uint8(f.Opcode)
	h.SetFlags(f.Flags)
	h.SetTag(f.Tag)
}

// Fields returns the header's fields.
func (h Header) Fields() HeaderFields {
	return HeaderFields{Opcode: h.Opcode(), Flags: h.Flags(), Tag: h.Tag()}
}

// PeekOpcode returns the version and opcode of a message without checking
// anything else (ok is false if b is shorter than a header). A target uses
// it to answer a LOGIN of an unknown version with a REJECT it understands.
func PeekOpcode(b []byte) (version uint8, op Opcode, ok bool) {
	if len(b) < HeaderLen {
		return 0, 0, false
	}
	return b[0], Opcode(b[1]), true
}

// ParseHeader checks the header of a message: its length, the version and
// that the opcode is known. It does not check the body.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return nil, errorf(ErrShort, "message of %d bytes, shorter than the %d-byte header", len(b), HeaderLen)
	}
	limit := MaxMessage
	if Opcode(b[1]) == OpData {
		limit = DataFixedLen + MaxInline
	}
	if len(b) > limit {
		return nil, errorf(ErrLength, "message of %d bytes, longer than the %d-byte maximum", len(b), limit)
	}
	if b[0] != Version {
		return nil, errorf(ErrVersion, "protocol version %d, this side speaks %d", b[0], Version)
	}
	op := Opcode(b[1])
	if _, ok := opNames[op]; !ok {
		return nil, errorf(ErrOpcode, "unknown opcode 0x%02x", uint8(op))
	}
	return Header(b[:HeaderLen:HeaderLen]), nil
}
