package rnic

import (
	"bytes"
	"encoding/binary"
)

// The large-FPDU extension (RNX1): two peers of this RNIC that both enable
// LargeFPDU use FPDUs of up to 64 KiB whatever the TCP MSS. RFC 5044 has no
// field for it, so it travels in-band, as an 8-byte block at the front of the
// MPA private data:
//
//	0..3  "RNX1"
//	4..5  the sender's largest ULPDU, big-endian (at least minMULPDU)
//	6..7  zero
//
// The Initiator offers it in its Request; a Responder that also enables it
// confirms with the same block in its Reply, and only then. The block is
// stripped only where it can be an offer or a confirmation: from a Request
// that begins with a well-formed block (the block is the offer), and from a
// Reply to a Request that offered it. Everywhere else (a Reply to a Request
// without the block, a Reject, a malformed block) the private data reaches
// the ULP byte for byte: peers that are not this RNIC (Linux nvme-rdma over
// siw, for one) carry their own structures there.

var extMagic = [4]byte{'R', 'N', 'X', '1'}

const extLen = 8

// withExt returns pd with the extension block in front when large is set,
// else pd itself.
func withExt(pd []byte, large bool) []byte {
	if !large {
		return pd
	}
	b := make([]byte, extLen, extLen+len(pd))
	copy(b, extMagic[:])
	binary.BigEndian.PutUint16(b[4:], maxULPDU)
	return append(b, pd...)
}

// splitExt parses a well-formed extension block at the front of pd: it
// returns the peer's largest ULPDU and the ULP's private data after the
// block, or ok false (and pd whole) when pd does not begin with one.
func splitExt(pd []byte) (peerMax int, ulp []byte, ok bool) {
	if len(pd) < extLen || !bytes.Equal(pd[:4], extMagic[:]) || pd[6] != 0 || pd[7] != 0 {
		return 0, pd, false
	}
	peerMax = int(binary.BigEndian.Uint16(pd[4:]))
	if peerMax < minMULPDU {
		return 0, pd, false
	}
	return peerMax, pd[extLen:], true
}
