package mpa

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/rnic-dev/rnic/rnic/term"
)

// MPA Request/Reply frame layout (RFC 5044 §7.1, RFC 6581).
const (
	FrameHeaderLen = 20  // key (16), flags, revision, PD_Length (2)
	MaxPrivateData = 512 // largest PD_Length
	keyLen         = 16
)

// The frame keys.
const (
	KeyRequest = "MPA ID Req Frame"
	KeyReply   = "MPA ID Rep Frame"
)

// Frame flags (byte 16).
const (
	FlagMarkers  = 0x80 // M: the sender wants markers on what it receives
	FlagCRC      = 0x40 // C: the sender wants CRCs (on if either side sets it)
	FlagReject   = 0x20 // R: Reply only, the connection is rejected
	FlagEnhanced = 0x10 // RFC 6581: private data starts with the IRD/ORD block (rev 2)
)

// Revisions accepted and sent.
const (
	Rev1 = 1 // RFC 5044
	Rev2 = 2 // RFC 6581
)

// Frame is an MPA Request or Reply.
type Frame struct {
	Reply                bool // Reply (KeyReply) rather than Request
	Markers, CRC, Reject bool
	Rev                  uint8   // 1 or 2
	Enhanced             *IRDORD // rev 2 with FlagEnhanced: the IRD/ORD block
	// PrivateData is the ULP's private data, without the IRD/ORD block.
	PrivateData []byte
}

// pdLen returns the PD_Length the frame needs.
func (f *Frame) pdLen() int {
	n := len(f.PrivateData)
	if f.Enhanced != nil {
		n += IRDORDLen
	}
	return n
}

// Append appends the encoded frame to b. PD_Length counts the IRD/ORD block;
// more than MaxPrivateData bytes, a revision other than 1 or 2, an IRD/ORD
// block outside revision 2 and a Request with Reject set are errors. The
// reserved flag bits are zero.
func (f *Frame) Append(b []byte) ([]byte, error) {
	switch {
	case f.Rev != Rev1 && f.Rev != Rev2:
		return b, fmt.Errorf("mpa: frame revision %d, only 1 and 2 are sent", f.Rev)
	case f.Enhanced != nil && f.Rev != Rev2:
		return b, errors.New("mpa: an IRD/ORD block needs revision 2")
	case f.Reject && !f.Reply:
		return b, errors.New("mpa: the Reject flag is for Replies only")
	case f.pdLen() > MaxPrivateData:
		return b, fmt.Errorf("mpa: %d bytes of private data, the maximum is %d", f.pdLen(), MaxPrivateData)
	}
	key := KeyRequest
	if f.Reply {
		key = KeyReply
	}
	var flags byte
	if f.Markers {
		flags |= FlagMarkers
	}
	if f.CRC {
		flags |= FlagCRC
	}
	if f.Reject {
		flags |= FlagReject
	}
	if f.Enhanced != nil {
		flags |= FlagEnhanced
	}
	b = append(b, key...)
	b = append(b, flags, f.Rev)
	b = binary.BigEndian.AppendUint16(b, uint16(f.pdLen()))
	if f.Enhanced != nil {
		var blk [IRDORDLen]byte
		f.Enhanced.Put(blk[:])
		b = append(b, blk[:]...)
	}
	return append(b, f.PrivateData...), nil
}

func frameError(format string, args ...any) *term.Error {
	return term.Errorf(term.LayerLLP, term.LLPMPA, term.MPAInvalidFrame, format, args...)
}

// parseHeader checks the 20-byte frame header and returns the frame's
// flags, revision and PD_Length.
func parseHeader(h []byte, reply bool) (Frame, int, error) {
	f := Frame{Reply: reply}
	want, other := KeyRequest, KeyReply
	if reply {
		want, other = KeyReply, KeyRequest
	}
	switch key := string(h[:keyLen]); key {
	case want:
	case other:
		return f, 0, frameError("got an MPA %s where a %s was expected", kind(!reply), kind(reply))
	default:
		return f, 0, frameError("bad MPA frame key %q", key)
	}
	flags, rev := h[16], h[17]
	if rev != Rev1 && rev != Rev2 {
		return f, 0, frameError("MPA %s revision %d, only 1 and 2 are supported", kind(reply), rev)
	}
	pd := int(binary.BigEndian.Uint16(h[18:20]))
	if pd > MaxPrivateData {
		return f, 0, frameError("MPA %s PD_Length %d exceeds %d", kind(reply), pd, MaxPrivateData)
	}
	f.Rev = rev
	f.Markers = flags&FlagMarkers != 0
	f.CRC = flags&FlagCRC != 0
	f.Reject = reply && flags&FlagReject != 0 // ignored in a Request
	if rev == Rev2 && flags&FlagEnhanced != 0 {
		if pd < IRDORDLen {
			return f, 0, frameError("MPA %s sets the enhanced flag with PD_Length %d, no room for the IRD/ORD block", kind(reply), pd)
		}
		f.Enhanced = &IRDORD{}
	}
	return f, pd, nil
}

func kind(reply bool) string {
	if reply {
		return "Reply"
	}
	return "Request"
}

// fillPD decodes the private data (pd bytes) into f.
func fillPD(f *Frame, pd []byte) {
	if f.Enhanced != nil {
		*f.Enhanced, _ = ParseIRDORD(pd) // length checked by parseHeader
		pd = pd[IRDORDLen:]
	}
	if len(pd) > 0 {
		f.PrivateData = pd
	}
}

// ParseFrame decodes the MPA Request (reply false) or Reply (reply true) at
// the start of b and returns it with the number of bytes it takes. Input
// shorter than the frame is io.ErrUnexpectedEOF. The wrong key (including a
// Reply where a Request is expected and the reverse), a revision other than
// 1 or 2, PD_Length > 512 and an enhanced frame too short for its IRD/ORD
// block are LLP / MPA / Invalid frame (0x04). Flags are reported, not
// judged: whether markers or a rejection are acceptable is the connection
// manager's policy. Reserved flag bits are ignored, and so is R in a
// Request. PrivateData aliases b.
func ParseFrame(b []byte, reply bool) (Frame, int, error) {
	if len(b) < FrameHeaderLen {
		return Frame{}, 0, io.ErrUnexpectedEOF
	}
	f, pd, err := parseHeader(b[:FrameHeaderLen], reply)
	if err != nil {
		return Frame{}, 0, err
	}
	n := FrameHeaderLen + pd
	if len(b) < n {
		return Frame{}, 0, io.ErrUnexpectedEOF
	}
	fillPD(&f, b[FrameHeaderLen:n:n])
	return f, n, nil
}

// ReadFrame reads one MPA Request or Reply from r, exactly its bytes and no
// more, so that the FPDU stream after it is left unread. Errors are those of
// ParseFrame; a stream that ends inside the frame is io.ErrUnexpectedEOF, and
// one that ends before it io.EOF.
func ReadFrame(r io.Reader, reply bool) (Frame, error) {
	var hdr [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, fmt.Errorf("mpa: reading %s header: %w", kind(reply), err)
	}
	f, pd, err := parseHeader(hdr[:], reply)
	if err != nil {
		return Frame{}, err
	}
	if pd > 0 {
		buf := make([]byte, pd)
		if _, err := io.ReadFull(r, buf); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, fmt.Errorf("mpa: reading %d bytes of %s private data: %w", pd, kind(reply), err)
		}
		fillPD(&f, buf)
	}
	return f, nil
}
