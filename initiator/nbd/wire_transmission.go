package nbd

import (
	"encoding/binary"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// RequestSize is the length of a transmission request header.
const RequestSize = 28

// Request is a view of a transmission request header (compact form):
//
//	0  magic   u32 (0x25609513)
//	4  flags   u16
//	6  type    u16
//	8  cookie  u64 (called handle in go-nbd and older specifications)
//	16 offset  u64
//	24 length  u32
//
// The methods read and write the fields in place; the slice must be at
// least RequestSize long.
type Request []byte

func (b Request) Magic() uint32  { return binary.BigEndian.Uint32(b[0:]) }
func (b Request) Flags() uint16  { return binary.BigEndian.Uint16(b[4:]) }
func (b Request) Type() uint16   { return binary.BigEndian.Uint16(b[6:]) }
func (b Request) Cookie() uint64 { return binary.BigEndian.Uint64(b[8:]) }
func (b Request) Offset() uint64 { return binary.BigEndian.Uint64(b[16:]) }
func (b Request) Length() uint32 { return binary.BigEndian.Uint32(b[24:]) }

func (b Request) SetMagic(v uint32)  { binary.BigEndian.PutUint32(b[0:], v) }
func (b Request) SetFlags(v uint16)  { binary.BigEndian.PutUint16(b[4:], v) }
func (b Request) SetType(v uint16)   { binary.BigEndian.PutUint16(b[6:], v) }
func (b Request) SetCookie(v uint64) { binary.BigEndian.PutUint64(b[8:], v) }
func (b Request) SetOffset(v uint64) { binary.BigEndian.PutUint64(b[16:], v) }
func (b Request) SetLength(v uint32) { binary.BigEndian.PutUint32(b[24:], v) }

// Encode writes f into b.
func (b Request) Encode(f protocol.TransmissionRequestHeader) {
	b.SetMagic(f.RequestMagic)
	b.SetFlags(f.CommandFlags)
	b.SetType(f.Type)
	b.SetCookie(f.Handle)
	b.SetOffset(f.Offset)
	b.SetLength(f.Length)
}

// Fields returns the header's fields.
func (b Request) Fields() protocol.TransmissionRequestHeader {
	return protocol.TransmissionRequestHeader{
		RequestMagic: b.Magic(),
		CommandFlags: b.Flags(),
		Type:         b.Type(),
		Handle:       b.Cookie(),
		Offset:       b.Offset(),
		Length:       b.Length(),
	}
}

// SimpleReplySize is the length of a simple reply header.
const SimpleReplySize = 16

// SimpleReply is a view of a simple reply header; a successful
// NBD_CMD_READ reply is followed by the data:
//
//	0  magic   u32 (0x67446698)
//	4  error   u32 (an NBD_E* value, 0 for success)
//	8  cookie  u64
type SimpleReply []byte

func (b SimpleReply) Magic() uint32  { return binary.BigEndian.Uint32(b[0:]) }
func (b SimpleReply) Error() uint32  { return binary.BigEndian.Uint32(b[4:]) }
func (b SimpleReply) Cookie() uint64 { return binary.BigEndian.Uint64(b[8:]) }

func (b SimpleReply) SetMagic(v uint32)  { binary.BigEndian.PutUint32(b[0:], v) }
func (b SimpleReply) SetError(v uint32)  { binary.BigEndian.PutUint32(b[4:], v) }
func (b SimpleReply) SetCookie(v uint64) { binary.BigEndian.PutUint64(b[8:], v) }

// Encode writes f into b.
func (b SimpleReply) Encode(f protocol.TransmissionReplyHeader) {
	b.SetMagic(f.ReplyMagic)
	b.SetError(f.Error)
	b.SetCookie(f.Handle)
}

// StructuredReplySize is the length of a structured reply chunk header.
const StructuredReplySize = 20

// StructuredReply is a view of a structured reply chunk header; Length
// bytes of payload follow:
//
//	0  magic   u32 (0x668e33ef)
//	4  flags   u16 (NBD_REPLY_FLAG_DONE: the reply's last chunk)
//	6  type    u16 (NBD_REPLY_TYPE_*)
//	8  cookie  u64
//	16 length  u32
type StructuredReply []byte

func (b StructuredReply) Magic() uint32  { return binary.BigEndian.Uint32(b[0:]) }
func (b StructuredReply) Flags() uint16  { return binary.BigEndian.Uint16(b[4:]) }
func (b StructuredReply) Type() uint16   { return binary.BigEndian.Uint16(b[6:]) }
func (b StructuredReply) Cookie() uint64 { return binary.BigEndian.Uint64(b[8:]) }
func (b StructuredReply) Length() uint32 { return binary.BigEndian.Uint32(b[16:]) }

// StructuredReplyFields are a chunk header's fields (go-nbd v0.3.2 has no
// structured replies).
type StructuredReplyFields struct {
	Flags, Type uint16
	Cookie      uint64
	Length      uint32
}

// Encode writes f into b, with the structured reply magic.
func (b StructuredReply) Encode(f StructuredReplyFields) {
	binary.BigEndian.PutUint32(b[0:], magicStructuredReply)
	binary.BigEndian.PutUint16(b[4:], f.Flags)
	binary.BigEndian.PutUint16(b[6:], f.Type)
	binary.BigEndian.PutUint64(b[8:], f.Cookie)
	binary.BigEndian.PutUint32(b[16:], f.Length)
}
