package blockproto

import "encoding/binary"

// CommandLen is the length of every command.
const CommandLen = 32

// Command is a view of a command (initiator to target): READ, WRITE, FLUSH,
// TRIM, WRITE_ZEROES, WRITE_REQ, RELEASE, HOLDER or BLOCK_STATUS.
type Command []byte

// CommandFields are a command's fields; which ones a command uses depends on
// its opcode (see the package documentation).
type CommandFields struct {
	Op     Opcode
	Flags  uint16
	Tag    uint32
	Offset uint64 // bytes (HOLDER: the reservation slot)
	Length uint32 // bytes
	STag   uint32 // WRITE: the buffer it invalidates; RELEASE: the buffer released
	Token  uint64 // fencing token (WRITE, TRIM, WRITE_ZEROES; 0: none)
}

// Op returns the opcode.
func (c Command) Op() Opcode { return Header(c).Opcode() }

// Flags returns the flags.
func (c Command) Flags() uint16 { return Header(c).Flags() }

// FUA reports FlagFUA.
func (c Command) FUA() bool { return c.Flags()&FlagFUA != 0 }

// Inline reports FlagInline (READ: answer with DATA).
func (c Command) Inline() bool { return c.Op() == OpRead && c.Flags()&FlagInline != 0 }

// NoHole reports FlagNoHole (WRITE_ZEROES: the range stays allocated).
func (c Command) NoHole() bool { return c.Op() == OpWriteZeroes && c.Flags()&FlagNoHole != 0 }

// Tag returns the request tag.
func (c Command) Tag() uint32 { return Header(c).Tag() }

// Offset returns the byte offset (HOLDER: the slot).
func (c Command) Offset() uint64 { return binary.BigEndian.Uint64(c[8:16]) }

// Length returns the byte length.
func (c Command) Length() uint32 { return binary.BigEndian.Uint32(c[16:20]) }

// STag returns the buffer STag.
func (c Command) STag() uint32 { return binary.BigEndian.Uint32(c[20:24]) }

// Token returns the fencing token.
func (c Command) Token() uint64 { return binary.BigEndian.Uint64(c[24:32]) }

// Encode writes the command (b at least CommandLen bytes).
func (c Command) Encode(f *CommandFields) {
	_ = c[CommandLen-1]
	Header(c).Encode(&HeaderFields{Opcode: f.Op, Flags: f.Flags, Tag: f.Tag})
	binary.BigEndian.PutUint64(c[8:16], f.Offset)
	binary.BigEndian.PutUint32(c[16:20], f.Length)
	binary.BigEndian.PutUint32(c[20:24], f.STag)
	binary.BigEndian.PutUint64(c[24:32], f.Token)
}

// Fields returns the command's fields.
func (c Command) Fields() CommandFields {
	return CommandFields{Op: c.Op(), Flags: c.Flags(), Tag: c.Tag(), Offset: c.Offset(), Length: c.Length(),
		STag: c.STag(), Token: c.Token()}
}

// commandRule says which fields an opcode uses: a field not used must be
// zero.
type commandRule struct {
	flags                         uint16
	offset, length, stag, token   bool
	needLength, needSTag, maxSlot bool
}

var commandRules = map[Opcode]commandRule{
	OpRead:        {flags: FlagInline, offset: true, length: true, needLength: true},
	OpWrite:       {flags: FlagFUA, offset: true, length: true, stag: true, token: true, needLength: true, needSTag: true},
	OpFlush:       {},
	OpTrim:        {offset: true, length: true, token: true, needLength: true},
	OpWriteZeroes: {flags: FlagFUA | FlagNoHole, offset: true, length: true, token: true, needLength: true},
	OpWriteReq:    {offset: true, length: true, needLength: true},
	OpRelease:     {stag: true, needSTag: true},
	OpHolder:      {offset: true, maxSlot: true},
	OpBlockStatus: {offset: true, length: true, needLength: true},
}

// ParseCommand checks a command: exact length, a command opcode, flags
// valid for it, unused fields zero, required fields present, and that the
// byte range does not wrap. Alignment and size limits are the target's to
// check.
func ParseCommand(b []byte) (Command, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	op := h.Opcode()
	r, ok := commandRules[op]
	if !ok {
		return nil, errorf(ErrOpcode, "%s is not a command", op)
	}
	if len(b) != CommandLen {
		return nil, errorf(ErrLength, "%s of %d bytes, want %d", op, len(b), CommandLen)
	}
	c := Command(b)
	if f := c.Flags() &^ r.flags; f != 0 {
		return nil, errorf(ErrFlags, "%s with unknown flags 0x%04x", op, f)
	}
	if (!r.offset && c.Offset() != 0) || (!r.length && c.Length() != 0) || (!r.stag && c.STag() != 0) ||
		(!r.token && c.Token() != 0) {
		return nil, errorf(ErrReserved, "%s with a field it does not use set", op)
	}
	if r.needLength && c.Length() == 0 {
		return nil, errorf(ErrField, "%s of length 0", op)
	}
	if r.needSTag && c.STag() == 0 {
		return nil, errorf(ErrField, "%s without an STag", op)
	}
	if r.maxSlot && c.Offset() > MaxSlot {
		return nil, errorf(ErrField, "%s of slot %d, slots are 0-%d", op, c.Offset(), MaxSlot)
	}
	if c.Offset()+uint64(c.Length()) < c.Offset() {
		return nil, errorf(ErrField, "%s offset %d + length %d wraps", op, c.Offset(), c.Length())
	}
	return c, nil
}
