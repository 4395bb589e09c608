package nvmf

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The capsule wire views: the 64-byte command (SQE) a host sends in every
// command capsule, the 16-byte completion (CQE) the controller sends back,
// and the 1024-byte data of a fabrics Connect. All fields are
// little-endian (NVMe Base 2.0 §4.2, §4.6; NVMe over Fabrics 1.1 §3.3).

// Sizes of the fixed structures.
const (
	CommandLen     = 64
	CompletionLen  = 16
	ConnectDataLen = 1024
	// NQNLen is the room for an NQN in Connect data and Identify (223
	// bytes of UTF-8 at most, NUL-terminated, in 256).
	NQNLen    = 256
	MaxNQNLen = 223
)

// Opcodes of the admin command set (NVMe Base 2.0 Figure 139).
const (
	AdminGetLogPage    = 0x02
	AdminIdentify      = 0x06
	AdminAbort         = 0x08
	AdminSetFeatures   = 0x09
	AdminGetFeatures   = 0x0a
	AdminAsyncEvent    = 0x0c
	AdminKeepAlive     = 0x18
	OpcodeFabrics      = 0x7f // fabrics commands, on either queue
	AdminDeleteSQ      = 0x00 // PCIe-only queue management: refused over fabrics
	AdminCreateSQ      = 0x01
	AdminDeleteCQ      = 0x04
	AdminCreateCQ      = 0x05
	AdminNSManagement  = 0x0d
	AdminFormatNVM     = 0x80
	AdminDirectiveSend = 0x19
)

// Opcodes of the NVM command set (NVMe NVM Command Set 1.0 Figure 18).
const (
	IOFlush        = 0x00
	IOWrite        = 0x01
	IORead         = 0x02
	IOWriteZeroes  = 0x08
	IODSM          = 0x09
	IOResvRegister = 0x0d
	IOResvReport   = 0x0e
	IOResvAcquire  = 0x11
	IOResvRelease  = 0x15
)

// Fabrics command types (the FCTYPE byte of opcode 0x7f).
const (
	FabricsPropertySet = 0x00
	FabricsConnect     = 0x01
	FabricsPropertyGet = 0x04
	FabricsAuthSend    = 0x05
	FabricsAuthRecv    = 0x06
	FabricsDisconnect  = 0x08
)

// PSDTSGL is the value of the command's PSDT field (flags bits 7:6) that
// says the data pointer is an SGL: fabrics commands always use SGLs.
const PSDTSGL = 1

// Command is a submission queue entry.
type Command []byte

// ParseCommand checks that b holds a command and returns its view.
func ParseCommand(b []byte) (Command, error) {
	if len(b) < CommandLen {
		return nil, fmt.Errorf("nvmf: command capsule of %d bytes, want at least %d", len(b), CommandLen)
	}
	return Command(b[:CommandLen]), nil
}

func (c Command) Opcode() uint8 { return c[0] }

// Flags is byte 1: FUSE in bits 1:0, PSDT in bits 7:6.
func (c Command) Flags() uint8 { return c[1] }

// PSDT is the PRP or SGL for Data Transfer field.
func (c Command) PSDT() uint8 { return c[1] >> 6 }

// Fuse is the fused-operation field.
func (c Command) Fuse() uint8 { return c[1] & 3 }

// CID is the command identifier the completion echoes.
func (c Command) CID() uint16 { return binary.LittleEndian.Uint16(c[2:]) }

// NSID is the namespace the command applies to.
func (c Command) NSID() uint32 { return binary.LittleEndian.Uint32(c[4:]) }

// FCType is the fabrics command type (opcode 0x7f only; it lies where
// other commands have the NSID).
func (c Command) FCType() uint8 { return c[4] }

// MPTR is the metadata pointer.
func (c Command) MPTR() uint64 { return binary.LittleEndian.Uint64(c[16:]) }

// DPTR is the data pointer: one SGL descriptor.
func (c Command) DPTR() SGL { return SGL(c[24:40]) }

// CDW returns command dword n (2, 3 or 10-15).
func (c Command) CDW(n int) uint32 {
	switch {
	case n == 2 || n == 3:
		return binary.LittleEndian.Uint32(c[8+4*(n-2):])
	case n >= 10 && n <= 15:
		return binary.LittleEndian.Uint32(c[40+4*(n-10):])
	}
	panic(fmt.Sprintf("nvmf: command dword %d has no place of its own", n))
}

// SLBA is the starting LBA of a read, write or write-zeroes (CDW10-11).
func (c Command) SLBA() uint64 { return binary.LittleEndian.Uint64(c[40:]) }

// NLB is the number of logical blocks (CDW12 bits 15:0 are NLB-1).
func (c Command) NLB() uint32 { return uint32(binary.LittleEndian.Uint16(c[48:])) + 1 }

// FUA reports CDW12 bit 30 (Force Unit Access) of a read or write.
func (c Command) FUA() bool { return c.CDW(12)&(1<<30) != 0 }

// Connect fields (NVMe over Fabrics 1.1 Figure 19).
func (c Command) ConnectRecFmt() uint16 { return binary.LittleEndian.Uint16(c[40:]) }
func (c Command) ConnectQID() uint16    { return binary.LittleEndian.Uint16(c[42:]) }

// ConnectSQSize is the 0-based submission queue size.
func (c Command) ConnectSQSize() uint16 { return binary.LittleEndian.Uint16(c[44:]) }
func (c Command) ConnectCAttr() uint8   { return c[46] }

// ConnectKATO is the keep alive timeout in milliseconds (admin queue).
func (c Command) ConnectKATO() uint32 { return binary.LittleEndian.Uint32(c[48:]) }

// Property Get/Set fields (NVMe over Fabrics 1.1 Figures 35, 37): the size
// (ATTRIB bits 2:0: 0 = 4 bytes, 1 = 8 bytes), the offset into the
// controller's property space and, for Set, the value.
func (c Command) PropertySize8() bool    { return c[40]&7 == 1 }
func (c Command) PropertyOffset() uint32 { return binary.LittleEndian.Uint32(c[44:]) }
func (c Command) PropertyValue() uint64  { return binary.LittleEndian.Uint64(c[48:]) }

// CommandFields are the fields of a command to encode.
type CommandFields struct {
	Opcode, Flags uint8
	CID           uint16
	NSID          uint32 // for fabrics commands, FCType goes in its low byte
	CDW2, CDW3    uint32
	MPTR          uint64
	DPTR          SGLFields
	CDW10_15      [6]uint32
}

// Encode writes f into c (64 bytes).
func (c Command) Encode(f *CommandFields) {
	clear(c[:CommandLen])
	c[0], c[1] = f.Opcode, f.Flags
	binary.LittleEndian.PutUint16(c[2:], f.CID)
	binary.LittleEndian.PutUint32(c[4:], f.NSID)
	binary.LittleEndian.PutUint32(c[8:], f.CDW2)
	binary.LittleEndian.PutUint32(c[12:], f.CDW3)
	binary.LittleEndian.PutUint64(c[16:], f.MPTR)
	c.DPTR().Encode(&f.DPTR)
	for i, v := range f.CDW10_15 {
		binary.LittleEndian.PutUint32(c[40+4*i:], v)
	}
}

// Completion is a completion queue entry.
type Completion []byte

// ParseCompletion checks that b holds a completion and returns its view.
func ParseCompletion(b []byte) (Completion, error) {
	if len(b) < CompletionLen {
		return nil, fmt.Errorf("nvmf: completion of %d bytes, want %d", len(b), CompletionLen)
	}
	return Completion(b[:CompletionLen]), nil
}

// Result is the command-specific dwords 0 and 1.
func (c Completion) Result() uint64 { return binary.LittleEndian.Uint64(c[0:]) }
func (c Completion) SQHead() uint16 { return binary.LittleEndian.Uint16(c[8:]) }
func (c Completion) SQID() uint16   { return binary.LittleEndian.Uint16(c[10:]) }
func (c Completion) CID() uint16    { return binary.LittleEndian.Uint16(c[12:]) }

// Status is the status field without the phase tag.
func (c Completion) Status() Status { return Status(binary.LittleEndian.Uint16(c[14:]) >> 1) }

// CompletionFields are the fields of a completion to encode.
type CompletionFields struct {
	Result       uint64
	SQHead, SQID uint16
	CID          uint16
	Status       Status
}

// Encode writes f into c (16 bytes). The phase tag is 0: a fabrics host
// does not use it (NVMe over Fabrics 1.1 §2.1).
func (c Completion) Encode(f *CompletionFields) {
	binary.LittleEndian.PutUint64(c[0:], f.Result)
	binary.LittleEndian.PutUint16(c[8:], f.SQHead)
	binary.LittleEndian.PutUint16(c[10:], f.SQID)
	binary.LittleEndian.PutUint16(c[12:], f.CID)
	binary.LittleEndian.PutUint16(c[14:], uint16(f.Status)<<1)
}

// ConnectData is the data of a Connect command (NVMe over Fabrics 1.1
// Figure 20): the host identifier, the controller ID (0xFFFF: any, on the
// admin queue), the subsystem NQN and the host NQN.
type ConnectData []byte

// Connect data offsets, also the IPO of an invalid-parameter completion.
const (
	ConnectDataCntlIDOff  = 16
	ConnectDataSubNQNOff  = 256
	ConnectDataHostNQNOff = 512
)

// DynamicCntlID in an admin queue's Connect asks for any controller.
const DynamicCntlID = 0xffff

// ParseConnectData checks the length of b and returns its view.
func ParseConnectData(b []byte) (ConnectData, error) {
	if len(b) < ConnectDataLen {
		return nil, fmt.Errorf("nvmf: Connect data of %d bytes, want %d", len(b), ConnectDataLen)
	}
	return ConnectData(b[:ConnectDataLen]), nil
}

// HostID is the 128-bit host identifier.
func (d ConnectData) HostID() (id [16]byte) { copy(id[:], d[0:16]); return }
func (d ConnectData) CntlID() uint16        { return binary.LittleEndian.Uint16(d[16:]) }

// SubNQN and HostNQN return the NQNs; ok is false if one is not a
// NUL-terminated string of at most MaxNQNLen bytes.
func (d ConnectData) SubNQN() (string, bool) { return cstring(d[256:512]) }
func (d ConnectData) HostNQN() (string, bool) {
	return cstring(d[512:768])
}

func cstring(b []byte) (string, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 || i > MaxNQNLen {
		return "", false
	}
	return string(b[:i]), true
}

// ConnectDataFields are the fields of Connect data to encode.
type ConnectDataFields struct {
	HostID          [16]byte
	CntlID          uint16
	SubNQN, HostNQN string
}

// Encode writes f into d (1024 bytes); NQNs longer than MaxNQNLen are
// cut.
func (d ConnectData) Encode(f *ConnectDataFields) {
	clear(d[:ConnectDataLen])
	copy(d[0:16], f.HostID[:])
	binary.LittleEndian.PutUint16(d[16:], f.CntlID)
	copy(d[256:256+MaxNQNLen], f.SubNQN)
	copy(d[512:512+MaxNQNLen], f.HostNQN)
}
