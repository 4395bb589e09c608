package blockproto

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
)

// ErrNoSecret is returned when a proof would be computed from an empty
// secret.
var ErrNoSecret = errors.New("blockproto: empty secret")

// Labels that separate the two proofs, so neither can stand in for the
// other.
const (
	initiatorLabel = "rnic-block v1 initiator proof"
	targetLabel    = "rnic-block v1 target proof"
)

// NewNonce returns NonceLen bytes from crypto/rand.
func NewNonce() ([NonceLen]byte, error) {
	var n [NonceLen]byte
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("blockproto: nonce: %w", err)
	}
	return n, nil
}

func writeField(h hash.Hash, b []byte) {
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(b)))
	h.Write(l[:])
	h.Write(b)
}

// InitiatorProof is HMAC-SHA256 keyed with the secret over the initiator
// label, the whole LOGIN and the whole CHALLENGE, each preceded by its
// length as 4 bytes big-endian.
func InitiatorProof(secret []byte, login Login, challenge Challenge) ([ProofLen]byte, error) {
	var out [ProofLen]byte
	if len(secret) == 0 {
		return out, ErrNoSecret
	}
	h := hmac.New(sha256.New, secret)
	writeField(h, []byte(initiatorLabel))
	writeField(h, login)
	writeField(h, challenge)
	h.Sum(out[:0])
	return out, nil
}

// TargetProof is HMAC-SHA256 keyed with the secret over the target label,
// the LOGIN, the CHALLENGE, the PROOF and the WELCOME with its proof field
// zeroed, each preceded by its length. It proves the target knows the
// secret and authenticates everything in the WELCOME.
func TargetProof(secret []byte, login Login, challenge Challenge, proof Proof, welcome Welcome) ([ProofLen]byte, error) {
	var out [ProofLen]byte
	if len(secret) == 0 {
		return out, ErrNoSecret
	}
	if len(welcome) < WelcomeFixedLen {
		return out, errorf(ErrShort, "WELCOME of %d bytes", len(welcome))
	}
	h := hmac.New(sha256.New, secret)
	writeField(h, []byte(targetLabel))
	writeField(h, login)
	writeField(h, challenge)
	writeField(h, proof)
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(welcome)))
	h.Write(l[:])
	h.Write(welcome[:72])
	var zeros [ProofLen]byte
	h.Write(zeros[:])
	h.Write(welcome[104:])
	h.Sum(out[:0])
	return out, nil
}

// ProofEqual compares two proofs in constant time.
func ProofEqual(a, b []byte) bool { return len(a) == ProofLen && hmac.Equal(a, b) }
