package blockproto

import "encoding/binary"

// NonceLen is the length of the login nonces and of an HMAC-SHA256 proof.
const (
	NonceLen = 32
	ProofLen = 32
)

// LoginFixedLen is the length of a LOGIN before its two names.
const LoginFixedLen = 56

// Login is a view of a LOGIN message (initiator to target, first message on
// every QP).
type Login []byte

// LoginFields are a LOGIN's fields.
type LoginFields struct {
	Join    bool   // FlagJoin: add this QP to session SessionID
	Credits uint16 // queue depth the initiator asks for on this QP
	// Inline (FlagInline when non-zero): the largest inline read the
	// initiator takes on this QP, a multiple of 512 up to MaxInline.
	Inline uint32
	// Extents (FlagExtents): the initiator may send BLOCK_STATUS.
	Extents bool
	// NoHole (FlagNoHole): the initiator may send WRITE_ZEROES with
	// FlagNoHole.
	NoHole    bool
	SessionID uint64 // with Join; 0 otherwise
	Nonce     [NonceLen]byte
	Initiator string
	Volume    string
}

// Join reports FlagJoin.
func (m Login) Join() bool { return Header(m).Flags()&FlagJoin != 0 }

// Extents reports FlagExtents.
func (m Login) Extents() bool { return Header(m).Flags()&FlagExtents != 0 }

// NoHole reports FlagNoHole.
func (m Login) NoHole() bool { return Header(m).Flags()&FlagNoHole != 0 }

// Inline returns the largest inline read the initiator takes (0: none).
func (m Login) Inline() uint32 { return binary.BigEndian.Uint32(m[12:16]) }

// Credits returns the requested queue depth.
func (m Login) Credits() uint16 { return binary.BigEndian.Uint16(m[8:10]) }

func (m Login) nameLen() int   { return int(m[10]) }
func (m Login) volumeLen() int { return int(m[11]) }

// SessionID returns the session to join (0 for a new session).
func (m Login) SessionID() uint64 { return binary.BigEndian.Uint64(m[16:24]) }

// Nonce returns the initiator's nonce.
func (m Login) Nonce() []byte { return m[24:56] }

// Initiator returns the initiator's name.
func (m Login) Initiator() []byte { return m[LoginFixedLen : LoginFixedLen+m.nameLen()] }

// Volume returns the volume's name.
func (m Login) Volume() []byte {
	s := LoginFixedLen + m.nameLen()
	return m[s : s+m.volumeLen()]
}

// LoginLen is the encoded length of f.
func LoginLen(f *LoginFields) int { return LoginFixedLen + len(f.Initiator) + len(f.Volume) }

// EncodeLogin writes a LOGIN into b (at least LoginLen(f) bytes) and
// returns the message. Names must satisfy ValidName.
func EncodeLogin(b []byte, f *LoginFields) (Login, error) {
	if !ValidName(f.Initiator) || !ValidName(f.Volume) {
		return nil, errorf(ErrField, "initiator and volume names must be 1-%d bytes of UTF-8 without control characters", MaxName)
	}
	n := LoginLen(f)
	if len(b) < n {
		return nil, errorf(ErrShort, "buffer of %d bytes for a %d-byte LOGIN", len(b), n)
	}
	if !validInline(f.Inline, MinInlineUnit) && f.Inline != 0 {
		return nil, errorf(ErrField, "LOGIN inline size %d is not a multiple of %d up to %d", f.Inline, MinInlineUnit, MaxInline)
	}
	m := Login(b[:n])
	var flags uint16
	if f.Join {
		flags = FlagJoin
	}
	if f.Inline != 0 {
		flags |= FlagInline
	}
	if f.Extents {
		flags |= FlagExtents
	}
	if f.NoHole {
		flags |= FlagNoHole
	}
	Header(m).Encode(&HeaderFields{Opcode: OpLogin, Flags: flags})
	binary.BigEndian.PutUint16(m[8:10], f.Credits)
	m[10] = uint8(len(f.Initiator))
	m[11] = uint8(len(f.Volume))
	binary.BigEndian.PutUint32(m[12:16], f.Inline)
	binary.BigEndian.PutUint64(m[16:24], f.SessionID)
	copy(m[24:56], f.Nonce[:])
	copy(m[LoginFixedLen:], f.Initiator)
	copy(m[LoginFixedLen+len(f.Initiator):], f.Volume)
	return m, nil
}

// Fields returns the LOGIN's fields.
func (m Login) Fields() LoginFields {
	f := LoginFields{Join: m.Join(), Credits: m.Credits(), Inline: m.Inline(), Extents: m.Extents(), NoHole: m.NoHole(), SessionID: m.SessionID(),
		Initiator: string(m.Initiator()), Volume: string(m.Volume())}
	copy(f.Nonce[:], m.Nonce())
	return f
}

// ParseLogin checks a LOGIN: exact length, flags, reserved bytes, names,
// the inline size (with FlagInline a multiple of 512 up to MaxInline, else
// 0), and that a join names a session and a new session does not.
func ParseLogin(b []byte) (Login, error) {
	if err := expect(b, OpLogin, LoginFixedLen, FlagJoin|FlagInline|FlagExtents|FlagNoHole); err != nil {
		return nil, err
	}
	m := Login(b)
	if n := LoginFixedLen + m.nameLen() + m.volumeLen(); len(b) != n {
		return nil, errorf(ErrLength, "LOGIN of %d bytes, names say %d", len(b), n)
	}
	if Header(b).Tag() != 0 {
		return nil, errorf(ErrReserved, "LOGIN tag not zero")
	}
	if Header(b).Flags()&FlagInline == 0 {
		if m.Inline() != 0 {
			return nil, errorf(ErrReserved, "LOGIN inline size %d without FlagInline", m.Inline())
		}
	} else if !validInline(m.Inline(), MinInlineUnit) {
		return nil, errorf(ErrField, "LOGIN inline size %d is not a multiple of %d in 1-%d", m.Inline(), MinInlineUnit, MaxInline)
	}
	if m.Credits() == 0 {
		return nil, errorf(ErrField, "LOGIN asks for zero credits")
	}
	if m.nameLen() == 0 || !validText(m.Initiator()) {
		return nil, errorf(ErrField, "LOGIN initiator name is empty or not printable UTF-8")
	}
	if m.volumeLen() == 0 || !validText(m.Volume()) {
		return nil, errorf(ErrField, "LOGIN volume name is empty or not printable UTF-8")
	}
	if m.Join() != (m.SessionID() != 0) {
		return nil, errorf(ErrField, "LOGIN join flag %v with session ID %#x", m.Join(), m.SessionID())
	}
	return m, nil
}

// ChallengeLen is the length of a CHALLENGE.
const ChallengeLen = 48

// AuthHMACSHA256 is the only authentication method of version 1.
const AuthHMACSHA256 = 1

// Challenge is a view of a CHALLENGE (target to initiator).
type Challenge []byte

// Method returns the authentication method.
func (m Challenge) Method() uint16 { return binary.BigEndian.Uint16(m[8:10]) }

// Nonce returns the target's nonce.
func (m Challenge) Nonce() []byte { return m[16:48] }

// EncodeChallenge writes a CHALLENGE with method HMAC-SHA256 into b.
func EncodeChallenge(b []byte, nonce *[NonceLen]byte) Challenge {
	m := Challenge(b[:ChallengeLen])
	Header(m).Encode(&HeaderFields{Opcode: OpChallenge})
	binary.BigEndian.PutUint16(m[8:10], AuthHMACSHA256)
	clear(m[10:16])
	copy(m[16:48], nonce[:])
	return m
}

// ParseChallenge checks a CHALLENGE.
func ParseChallenge(b []byte) (Challenge, error) {
	if err := expect(b, OpChallenge, ChallengeLen, 0); err != nil {
		return nil, err
	}
	if len(b) != ChallengeLen {
		return nil, errorf(ErrLength, "CHALLENGE of %d bytes, want %d", len(b), ChallengeLen)
	}
	m := Challenge(b)
	if Header(b).Tag() != 0 || !zero(b[10:16]) {
		return nil, errorf(ErrReserved, "CHALLENGE tag or reserved bytes 10-15 not zero")
	}
	if m.Method() != AuthHMACSHA256 {
		return nil, errorf(ErrField, "CHALLENGE method %d, only %d (HMAC-SHA256) is defined", m.Method(), AuthHMACSHA256)
	}
	return m, nil
}

// ProofMsgLen is the length of a PROOF.
const ProofMsgLen = HeaderLen + ProofLen

// Proof is a view of a PROOF (initiator to target).
type Proof []byte

// MAC returns the initiator's proof.
func (m Proof) MAC() []byte { return m[8:40] }

// EncodeProof writes a PROOF into b.
func EncodeProof(b []byte, mac []byte) Proof {
	m := Proof(b[:ProofMsgLen])
	Header(m).Encode(&HeaderFields{Opcode: OpProof})
	copy(m[8:40], mac)
	return m
}

// ParseProof checks a PROOF.
func ParseProof(b []byte) (Proof, error) {
	if err := expect(b, OpProof, ProofMsgLen, 0); err != nil {
		return nil, err
	}
	if len(b) != ProofMsgLen {
		return nil, errorf(ErrLength, "PROOF of %d bytes, want %d", len(b), ProofMsgLen)
	}
	if Header(b).Tag() != 0 {
		return nil, errorf(ErrReserved, "PROOF tag not zero")
	}
	return Proof(b), nil
}

// expect checks the header of b: length at least min, opcode op, no flags
// outside allowed.
func expect(b []byte, op Opcode, min int, allowed uint16) error {
	h, err := ParseHeader(b)
	if err != nil {
		return err
	}
	if h.Opcode() != op {
		return errorf(ErrOpcode, "%s where %s was expected", h.Opcode(), op)
	}
	if len(b) < min {
		return errorf(ErrShort, "%s of %d bytes, shorter than its %d-byte fixed part", op, len(b), min)
	}
	if f := h.Flags() &^ allowed; f != 0 {
		return errorf(ErrFlags, "%s with unknown flags 0x%04x", op, f)
	}
	return nil
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
