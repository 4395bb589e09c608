package blockproto

import "encoding/binary"

// WelcomeFixedLen is the length of a WELCOME before its grants; a WELCOME
// with FlagInline has WelcomeInlineLen bytes before them.
const (
	WelcomeFixedLen  = 104
	WelcomeInlineLen = 112
)

// MaxWelcomeGrants is the most grants a WELCOME carries.
const MaxWelcomeGrants = 16

// NoSlot is the reservation slot of a session that has none.
const NoSlot = 0xFF

// VolumeReadOnly is a volume flag: writes are refused with StatusReadOnly.
const VolumeReadOnly = 0x00000001

// Welcome is a view of a WELCOME (target to initiator): the login
// succeeded.
type Welcome []byte

// WelcomeFields are a WELCOME's fields.
type WelcomeFields struct {
	SessionID uint64
	// BootID changes when the target process restarts. For a volume of a
	// store several targets share (rtarget in front of Ceph RBD), whose
	// acknowledged writes are durable in that store, it is the store's ID
	// instead: the same at every target serving the volume.
	BootID      uint64
	VolumeSize  uint64 // bytes
	VolumeID    uint32
	MaxTransfer uint32 // largest READ/WRITE length
	GrantSize   uint32 // data bytes a fast-path grant takes
	Credits     uint16 // commands this QP may have outstanding
	Slot        uint8  // reservation slot of the session (0..62)
	LockSTag    uint32 // the lock table (remote atomic)
	LockCount   uint32 // numbered locks
	LockTO      uint64 // tagged offset of word 0 of the lock table
	MinIO       uint16 // offsets and lengths are multiples of this (512)
	PreferredIO uint16 // the store's block size (4096)
	VolumeFlags uint32
	TargetProof [ProofLen]byte
	// Inline (FlagInline when non-zero): the largest READ the target
	// answers inline on this QP, a multiple of MinIO up to MaxInline.
	Inline uint32
	// Extents (FlagExtents): the target answers BLOCK_STATUS on this QP.
	Extents bool
	// NoHole (FlagNoHole): the target honours FlagNoHole on WRITE_ZEROES
	// on this QP.
	NoHole bool
	Grants []GrantFields // at most MaxWelcomeGrants
}

// SessionID returns the session's ID.
func (m Welcome) SessionID() uint64 { return binary.BigEndian.Uint64(m[8:16]) }

// BootID returns the target incarnation's ID.
func (m Welcome) BootID() uint64 { return binary.BigEndian.Uint64(m[16:24]) }

// VolumeSize returns the volume's size in bytes.
func (m Welcome) VolumeSize() uint64 { return binary.BigEndian.Uint64(m[24:32]) }

// VolumeID returns the store's volume ID.
func (m Welcome) VolumeID() uint32 { return binary.BigEndian.Uint32(m[32:36]) }

// MaxTransfer returns the largest READ or WRITE length.
func (m Welcome) MaxTransfer() uint32 { return binary.BigEndian.Uint32(m[36:40]) }

// GrantSize returns the data capacity of a fast-path grant.
func (m Welcome) GrantSize() uint32 { return binary.BigEndian.Uint32(m[40:44]) }

// Credits returns the queue depth granted on this QP.
func (m Welcome) Credits() uint16 { return binary.BigEndian.Uint16(m[44:46]) }

// Slot returns the session's reservation slot.
func (m Welcome) Slot() uint8 { return m[46] }

// GrantCount returns the number of grants that follow the fixed part.
func (m Welcome) GrantCount() int { return int(m[47]) }

// LockSTag returns the lock table's STag.
func (m Welcome) LockSTag() uint32 { return binary.BigEndian.Uint32(m[48:52]) }

// LockCount returns the number of numbered locks.
func (m Welcome) LockCount() uint32 { return binary.BigEndian.Uint32(m[52:56]) }

// LockTO returns the tagged offset of the lock table's word 0.
func (m Welcome) LockTO() uint64 { return binary.BigEndian.Uint64(m[56:64]) }

// MinIO returns the alignment of offsets and lengths.
func (m Welcome) MinIO() uint16 { return binary.BigEndian.Uint16(m[64:66]) }

// PreferredIO returns the store's block size.
func (m Welcome) PreferredIO() uint16 { return binary.BigEndian.Uint16(m[66:68]) }

// VolumeFlags returns the volume flags.
func (m Welcome) VolumeFlags() uint32 { return binary.BigEndian.Uint32(m[68:72]) }

// TargetProof returns the target's proof of the secret.
func (m Welcome) TargetProof() []byte { return m[72:104] }

// Inline returns the largest READ answered inline (0: none).
func (m Welcome) Inline() uint32 {
	if Header(m).Flags()&FlagInline == 0 {
		return 0
	}
	return binary.BigEndian.Uint32(m[104:108])
}

func (m Welcome) fixedLen() int {
	if Header(m).Flags()&FlagInline != 0 {
		return WelcomeInlineLen
	}
	return WelcomeFixedLen
}

// Grant returns grant i (i < GrantCount()).
func (m Welcome) Grant(i int) Grant {
	s := m.fixedLen() + i*GrantLen
	return Grant(m[s : s+GrantLen])
}

// WelcomeLen is the encoded length of f.
func WelcomeLen(f *WelcomeFields) int {
	n := WelcomeFixedLen
	if f.Inline != 0 {
		n = WelcomeInlineLen
	}
	return n + len(f.Grants)*GrantLen
}

// EncodeWelcome writes a WELCOME into b (at least WelcomeLen(f) bytes).
func EncodeWelcome(b []byte, f *WelcomeFields) (Welcome, error) {
	if len(f.Grants) > MaxWelcomeGrants {
		return nil, errorf(ErrField, "%d grants, at most %d", len(f.Grants), MaxWelcomeGrants)
	}
	n := WelcomeLen(f)
	if len(b) < n {
		return nil, errorf(ErrShort, "buffer of %d bytes for a %d-byte WELCOME", len(b), n)
	}
	if f.Inline != 0 && !validInline(f.Inline, uint64(f.MinIO)) {
		return nil, errorf(ErrField, "WELCOME inline size %d is not a multiple of %d up to %d", f.Inline, f.MinIO, MaxInline)
	}
	m := Welcome(b[:n])
	var flags uint16
	if f.Inline != 0 {
		flags = FlagInline
		binary.BigEndian.PutUint32(m[104:108], f.Inline)
		clear(m[108:112])
	}
	if f.Extents {
		flags |= FlagExtents
	}
	if f.NoHole {
		flags |= FlagNoHole
	}
	Header(m).Encode(&HeaderFields{Opcode: OpWelcome, Flags: flags})
	be := binary.BigEndian
	be.PutUint64(m[8:16], f.SessionID)
	be.PutUint64(m[16:24], f.BootID)
	be.PutUint64(m[24:32], f.VolumeSize)
	be.PutUint32(m[32:36], f.VolumeID)
	be.PutUint32(m[36:40], f.MaxTransfer)
	be.PutUint32(m[40:44], f.GrantSize)
	be.PutUint16(m[44:46], f.Credits)
	m[46] = f.Slot
	m[47] = uint8(len(f.Grants))
	be.PutUint32(m[48:52], f.LockSTag)
	be.PutUint32(m[52:56], f.LockCount)
	be.PutUint64(m[56:64], f.LockTO)
	be.PutUint16(m[64:66], f.MinIO)
	be.PutUint16(m[66:68], f.PreferredIO)
	be.PutUint32(m[68:72], f.VolumeFlags)
	copy(m[72:104], f.TargetProof[:])
	for i := range f.Grants {
		m.Grant(i).Encode(&f.Grants[i])
	}
	return m, nil
}

// Fields returns the WELCOME's fields.
func (m Welcome) Fields() WelcomeFields {
	f := WelcomeFields{SessionID: m.SessionID(), BootID: m.BootID(), VolumeSize: m.VolumeSize(),
		VolumeID: m.VolumeID(), MaxTransfer: m.MaxTransfer(), GrantSize: m.GrantSize(), Credits: m.Credits(),
		Slot: m.Slot(), LockSTag: m.LockSTag(), LockCount: m.LockCount(), LockTO: m.LockTO(), MinIO: m.MinIO(),
		PreferredIO: m.PreferredIO(), VolumeFlags: m.VolumeFlags(), Inline: m.Inline(),
		Extents: Header(m).Flags()&FlagExtents != 0, NoHole: Header(m).Flags()&FlagNoHole != 0}
	copy(f.TargetProof[:], m.TargetProof())
	if n := m.GrantCount(); n > 0 {
		f.Grants = make([]GrantFields, n)
		for i := range f.Grants {
			f.Grants[i] = m.Grant(i).Fields()
		}
	}
	return f
}

// ParseWelcome checks a WELCOME: length, geometry (a positive size that is
// a multiple of MinIO, MinIO and PreferredIO powers of two with MinIO <=
// PreferredIO, MaxTransfer and GrantSize multiples of MinIO), credits, slot,
// flags, the inline size (FlagInline: a multiple of MinIO up to MaxInline)
// and every grant.
func ParseWelcome(b []byte) (Welcome, error) {
	if err := expect(b, OpWelcome, WelcomeFixedLen, FlagInline|FlagExtents|FlagNoHole); err != nil {
		return nil, err
	}
	m := Welcome(b)
	if len(b) < m.fixedLen() {
		return nil, errorf(ErrShort, "WELCOME of %d bytes, shorter than its %d-byte fixed part", len(b), m.fixedLen())
	}
	g := m.GrantCount()
	if g > MaxWelcomeGrants {
		return nil, errorf(ErrField, "WELCOME with %d grants, at most %d", g, MaxWelcomeGrants)
	}
	if n := m.fixedLen() + g*GrantLen; len(b) != n {
		return nil, errorf(ErrLength, "WELCOME of %d bytes, %d grants say %d", len(b), g, n)
	}
	if Header(b).Tag() != 0 {
		return nil, errorf(ErrReserved, "WELCOME tag not zero")
	}
	if m.SessionID() == 0 {
		return nil, errorf(ErrField, "WELCOME session ID 0")
	}
	min, pref := uint64(m.MinIO()), uint64(m.PreferredIO())
	if !pow2(min) || !pow2(pref) || min > pref {
		return nil, errorf(ErrField, "WELCOME I/O sizes %d/%d are not powers of two with min <= preferred", min, pref)
	}
	if m.VolumeSize() == 0 || m.VolumeSize()%min != 0 {
		return nil, errorf(ErrField, "WELCOME volume size %d is not a positive multiple of %d", m.VolumeSize(), min)
	}
	if m.MaxTransfer() == 0 || uint64(m.MaxTransfer())%min != 0 || uint64(m.GrantSize())%min != 0 {
		return nil, errorf(ErrField, "WELCOME max transfer %d / grant size %d not multiples of %d", m.MaxTransfer(), m.GrantSize(), min)
	}
	if m.Credits() == 0 {
		return nil, errorf(ErrField, "WELCOME grants zero credits")
	}
	if m.fixedLen() == WelcomeInlineLen {
		if !validInline(m.Inline(), min) {
			return nil, errorf(ErrField, "WELCOME inline size %d is not a multiple of %d in 1-%d", m.Inline(), min, MaxInline)
		}
		if !zero(m[108:112]) {
			return nil, errorf(ErrReserved, "WELCOME reserved bytes 108-111 not zero")
		}
	}
	if m.Slot() > MaxSlot && m.Slot() != NoSlot {
		return nil, errorf(ErrField, "WELCOME reservation slot %d", m.Slot())
	}
	if m.VolumeFlags()&^VolumeReadOnly != 0 {
		return nil, errorf(ErrFlags, "WELCOME unknown volume flags 0x%08x", m.VolumeFlags())
	}
	if m.LockSTag() == 0 && (m.LockCount() != 0 || m.LockTO() != 0) {
		return nil, errorf(ErrField, "WELCOME lock table fields without an STag")
	}
	if m.LockTO()%8 != 0 {
		return nil, errorf(ErrField, "WELCOME lock table offset 0x%x is not 8-byte aligned", m.LockTO())
	}
	if m.LockSTag() != 0 && m.LockCount() > MaxLocks {
		return nil, errorf(ErrField, "WELCOME lock count %d above %d", m.LockCount(), MaxLocks)
	}
	for i := 0; i < g; i++ {
		gr := m.Grant(i)
		if gr.STag() == 0 {
			return nil, errorf(ErrField, "WELCOME grant %d has no STag", i)
		}
		if err := gr.check("WELCOME grant"); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func pow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }
