package rdmap

import (
	"bytes"
	"encoding/binary"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/term"
)

// Header-control bits of Terminate byte 2 (RFC 5040 Figure 8).
const (
	termFlagM = 0x80 // DDP Segment Length valid
	termFlagD = 0x40 // Terminated DDP Header included
	termFlagR = 0x20 // Terminated RDMA Header included
)

// TerminateFields is a decoded Terminate header (RFC 5040 §4.8).
type TerminateFields struct {
	Cause term.Cause
	// M: SegLen is valid; D: DDPHeader is included; R: RDMA header included.
	M, D, R bool
	// SegLen is the DDP segment length of the offending segment. This
	// package sends the MPA ULPDU_LENGTH, the length DDP hands up (RFC
	// 5040 §4.8); it is diagnostic only and never interpreted on receive.
	SegLen uint16
	// DDPHeader is the offending segment's DDP header: 14 bytes if its own
	// T bit is set, 18 otherwise.
	DDPHeader []byte
	// RDMAHeader is the offending RDMA Read Request header (28 bytes); only
	// a Read Request is ever echoed.
	RDMAHeader []byte
}

// ddpHeaderLen returns the length of the DDP header starting at h, by its
// own T bit (an empty h counts as untagged).
func ddpHeaderLen(h []byte) int {
	if len(h) > 0 && ddp.IsTagged(h[0]) {
		return ddp.TaggedHeaderLen
	}
	return ddp.UntaggedHeaderLen
}

// echoesReadRequest reports whether an echoed DDP header is an untagged
// RDMA Read Request (RV 01b or 00b, RFC 5040 §4.1), the only message whose
// RDMA header is echoed.
func echoesReadRequest(h []byte) bool {
	return len(h) >= ddp.UntaggedHeaderLen && !ddp.IsTagged(h[0]) &&
		Opcode(h[1]&maskOpcode) == OpReadRequest && ValidVersion(CtrlVersion(h[1]), OpReadRequest)
}

// appendFixed appends exactly n bytes of p: truncated or zero-padded.
func appendFixed(b, p []byte, n int) []byte {
	p = p[:min(len(p), n)]
	b = append(b, p...)
	for range n - len(p) {
		b = append(b, 0)
	}
	return b
}

// AppendTerminate appends the Terminate header for f to b. With M, D and R
// all clear it is the 4-byte control word alone (as siw sends it). Otherwise
// the DDP Segment Length follows, then, if D, the DDP header (14 or 18 bytes
// by its T bit, zero-padded or cut to that size), then, if R, the echoed
// header is a Read Request and RDMAHeader is not empty, the 28-byte RDMA
// header (zero-padded or cut). R without D cannot be placed and is dropped.
// The 13 reserved bits are zero.
func AppendTerminate(b []byte, f *TerminateFields) []byte {
	r := f.R && f.D
	var flags byte
	if f.M {
		flags |= termFlagM
	}
	if f.D {
		flags |= termFlagD
	}
	if r {
		flags |= termFlagR
	}
	b = append(b, f.Cause.Byte0(), byte(f.Cause.Code), flags, 0)
	if flags == 0 {
		return b
	}
	b = binary.BigEndian.AppendUint16(b, f.SegLen)
	if f.D {
		hdr := appendFixed(nil, f.DDPHeader, ddpHeaderLen(f.DDPHeader))
		b = append(b, hdr...)
		if r && echoesReadRequest(hdr) && len(f.RDMAHeader) > 0 {
			b = appendFixed(b, f.RDMAHeader, ReadRequestLen)
		}
	}
	return b
}

func termError(format string, args ...any) *term.Error {
	return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnspecified, "Terminate: "+format, args...)
}

// ParseTerminate decodes a received Terminate header (the message after its
// 18-byte DDP header). It accepts the 4-byte control word and forms with
// zero-filled trailing fields. The echoed DDP header is sized by its own T
// bit. RDMA header bytes are expected only when R is set, the echoed header
// is a Read Request and the bytes are there: siw sets R for every Remote
// Protection error but echoes no RDMA header for Send with Invalidate
// (RFC 5040 §4.8 echoes it for a Read Request only). Everything past the
// fields the flags announce must be zero. The returned slices are copies,
// not views of b.
//
// A malformed Terminate is RDMA / Remote Operation / Unspecified (0/2/0xFF);
// the engine must not answer a Terminate with a Terminate, so the cause is
// informative only.
func ParseTerminate(b []byte) (TerminateFields, error) {
	var f TerminateFields
	if len(b) < TerminateMinLen {
		return f, termError("%d bytes, shorter than the %d-byte control word", len(b), TerminateMinLen)
	}
	if len(b) > TerminateMaxLen {
		return f, termError("%d bytes, longer than the %d-byte maximum", len(b), TerminateMaxLen)
	}
	f.Cause = term.FromBytes(b[0], b[1])
	switch c := f.Cause; {
	case c.Layer > term.LayerLLP:
		return f, termError("unknown layer %d", c.Layer)
	case c.Layer != term.LayerLLP && c.EType > term.DDPUntagged:
		return f, termError("unknown error type %d for layer %v", c.EType, c.Layer)
	}
	f.M, f.D, f.R = b[2]&termFlagM != 0, b[2]&termFlagD != 0, b[2]&termFlagR != 0
	rest := b[TerminateMinLen:]
	if f.R && !f.D {
		return f, termError("R set without D")
	}
	if f.M || f.D {
		if len(rest) < 2 {
			return f, termError("M or D set but no DDP Segment Length")
		}
		f.SegLen = binary.BigEndian.Uint16(rest)
		rest = rest[2:]
	}
	if f.D {
		if len(rest) == 0 {
			return f, termError("D set but no DDP header")
		}
		hl := ddpHeaderLen(rest)
		if len(rest) < hl {
			return f, termError("echoed DDP header of %d bytes, its T bit says %d", len(rest), hl)
		}
		f.DDPHeader = bytes.Clone(rest[:hl])
		rest = rest[hl:]
		if f.R && echoesReadRequest(f.DDPHeader) && len(rest) > 0 {
			if len(rest) < ReadRequestLen {
				return f, termError("echoed RDMA Read Request header of %d bytes, want %d", len(rest), ReadRequestLen)
			}
			f.RDMAHeader = bytes.Clone(rest[:ReadRequestLen])
			rest = rest[ReadRequestLen:]
		}
	}
	for _, c := range rest {
		if c != 0 {
			return f, termError("%d bytes past the announced fields are not zero", len(rest))
		}
	}
	return f, nil
}

// TerminateFor builds the Terminate for cause, applying RFC 5040 Figure 10
// and §7.1 to decide what to echo:
//
//   - LLP errors and RDMA Local Catastrophic errors echo nothing;
//   - every DDP error echoes the DDP Segment Length and the DDP header (M
//     and D): Figure 10 says "Yes" for the DDP layer, whatever the error,
//     Invalid DDP Version included. A DDP header cut short by its segment
//     is echoed zero-padded to the size its T bit gives;
//   - RDMA Remote Operation errors echo the DDP Segment Length and the DDP
//     header, "if possible" (only a whole header is echoed);
//   - RDMA Remote Protection errors do the same and, when the offending
//     message is an RDMA Read Request, also echo its RDMA header (R).
//
// offending is the offending segment's ULPDU from its DDP header on (the
// Read Request header after it, when there is one), or nil when the error is
// not tied to an incoming segment. ulpduLen is sent as the DDP Segment
// Length (clamped to 0..65535). The result holds copies, not views of
// offending.
func TerminateFor(cause term.Cause, offending []byte, ulpduLen int) TerminateFields {
	f := TerminateFields{Cause: cause}
	var echo, pad, rdma bool
	switch cause.Layer {
	case term.LayerRDMAP:
		echo = cause.EType == term.RDMARemoteProtection || cause.EType == term.RDMARemoteOperation
		rdma = cause.EType == term.RDMARemoteProtection
	case term.LayerDDP:
		echo = cause.EType <= term.DDPUntagged // RFC 5040 Figure 10: "DDP | Yes | No | Any"
		pad = true
	}
	if !echo || len(offending) == 0 {
		return f
	}
	hl := ddpHeaderLen(offending)
	if len(offending) < hl && !pad {
		return f
	}
	f.M, f.D = true, true
	f.SegLen = uint16(max(0, min(ulpduLen, 0xFFFF)))
	f.DDPHeader = appendFixed(nil, offending, hl)
	if rdma && echoesReadRequest(offending) && len(offending) >= hl+ReadRequestLen {
		f.R = true
		f.RDMAHeader = bytes.Clone(offending[hl : hl+ReadRequestLen])
	}
	return f
}
