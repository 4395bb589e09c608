package nbd

import (
	"encoding/binary"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// GreetingSize is the length of the server's newstyle greeting.
const GreetingSize = 18

// Greeting is a view of the newstyle greeting the server sends first:
//
//	0  "NBDMAGIC"        u64
//	8  "IHAVEOPT"        u64
//	16 handshake flags   u16
//
// The client answers with its 32-bit client flags.
type Greeting []byte

func (b Greeting) InitMagic() uint64      { return binary.BigEndian.Uint64(b[0:]) }
func (b Greeting) OptionMagic() uint64    { return binary.BigEndian.Uint64(b[8:]) }
func (b Greeting) HandshakeFlags() uint16 { return binary.BigEndian.Uint16(b[16:]) }

// Encode writes f into b.
func (b Greeting) Encode(f protocol.NegotiationNewstyleHeader) {
	binary.BigEndian.PutUint64(b[0:], f.OldstyleMagic)
	binary.BigEndian.PutUint64(b[8:], f.OptionMagic)
	binary.BigEndian.PutUint16(b[16:], f.HandshakeFlags)
}

// OptionSize is the length of an option header.
const OptionSize = 16

// Option is a view of the header of an option the client sends during
// option haggling; Length bytes of option data follow:
//
//	0  "IHAVEOPT"  u64
//	8  option      u32
//	12 length      u32
type Option []byte

func (b Option) Magic() uint64  { return binary.BigEndian.Uint64(b[0:]) }
func (b Option) ID() uint32     { return binary.BigEndian.Uint32(b[8:]) }
func (b Option) Length() uint32 { return binary.BigEndian.Uint32(b[12:]) }

// Encode writes f into b.
func (b Option) Encode(f protocol.NegotiationOptionHeader) {
	binary.BigEndian.PutUint64(b[0:], f.OptionMagic)
	binary.BigEndian.PutUint32(b[8:], f.ID)
	binary.BigEndian.PutUint32(b[12:], f.Length)
}

// OptionReplySize is the length of an option reply header.
const OptionReplySize = 20

// OptionReply is a view of the header of the server's reply to an option
// (fixed newstyle); Length bytes of reply data follow:
//
//	0  magic       u64 (0x3e889045565a9)
//	8  option      u32
//	12 reply type  u32
//	16 length      u32
type OptionReply []byte

func (b OptionReply) Magic() uint64  { return binary.BigEndian.Uint64(b[0:]) }
func (b OptionReply) Option() uint32 { return binary.BigEndian.Uint32(b[8:]) }
func (b OptionReply) Type() uint32   { return binary.BigEndian.Uint32(b[12:]) }
func (b OptionReply) Length() uint32 { return binary.BigEndian.Uint32(b[16:]) }

// Encode writes f into b.
func (b OptionReply) Encode(f protocol.NegotiationReplyHeader) {
	binary.BigEndian.PutUint64(b[0:], f.ReplyMagic)
	binary.BigEndian.PutUint32(b[8:], f.ID)
	binary.BigEndian.PutUint32(b[12:], f.Type)
	binary.BigEndian.PutUint32(b[16:], f.Length)
}

// InfoExportSize is the length of an NBD_INFO_EXPORT payload.
const InfoExportSize = 12

// InfoExport is a view of an NBD_INFO_EXPORT payload:
//
//	0  type (0)           u16
//	2  export size        u64
//	10 transmission flags u16
type InfoExport []byte

func (b InfoExport) Type() uint16  { return binary.BigEndian.Uint16(b[0:]) }
func (b InfoExport) Size() uint64  { return binary.BigEndian.Uint64(b[2:]) }
func (b InfoExport) Flags() uint16 { return binary.BigEndian.Uint16(b[10:]) }

// Encode writes f into b.
func (b InfoExport) Encode(f protocol.NegotiationReplyInfo) {
	binary.BigEndian.PutUint16(b[0:], f.Type)
	binary.BigEndian.PutUint64(b[2:], f.Size)
	binary.BigEndian.PutUint16(b[10:], f.TransmissionFlags)
}

// InfoBlockSizeSize is the length of an NBD_INFO_BLOCK_SIZE payload.
const InfoBlockSizeSize = 14

// InfoBlockSize is a view of an NBD_INFO_BLOCK_SIZE payload:
//
//	0  type (3)             u16
//	2  minimum block size   u32
//	6  preferred block size u32
//	10 maximum payload size u32
type InfoBlockSize []byte

func (b InfoBlockSize) Type() uint16      { return binary.BigEndian.Uint16(b[0:]) }
func (b InfoBlockSize) Minimum() uint32   { return binary.BigEndian.Uint32(b[2:]) }
func (b InfoBlockSize) Preferred() uint32 { return binary.BigEndian.Uint32(b[6:]) }
func (b InfoBlockSize) Maximum() uint32   { return binary.BigEndian.Uint32(b[10:]) }

// Encode writes f into b.
func (b InfoBlockSize) Encode(f protocol.NegotiationReplyBlockSize) {
	binary.BigEndian.PutUint16(b[0:], f.Type)
	binary.BigEndian.PutUint32(b[2:], f.MinimumBlockSize)
	binary.BigEndian.PutUint32(b[6:], f.PreferredBlockSize)
	binary.BigEndian.PutUint32(b[10:], f.MaximumBlockSize)
}

// ExportNameReplySize is the length of the reply to NBD_OPT_EXPORT_NAME
// without the 124 reserved zero bytes (sent unless the client set
// NBD_FLAG_C_NO_ZEROES): export size u64, transmission flags u16.
const ExportNameReplySize = 10

// exportNameZeroes is the length of the reserved zeroes after it.
const exportNameZeroes = 124
