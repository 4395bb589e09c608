package mpa

// FPDU framing (RFC 5044 §4).
const (
	HeaderLen      = 2   // ULPDU_LENGTH, big-endian
	CRCLen         = 4   // CRC32c, least significant byte first; sent even when CRCs are off
	MarkerInterval = 512 // markers sit every 512 bytes of stream
	MarkerLen      = 4   // 16 reserved bits + 16-bit FPDUPTR
	MaxULPDU       = 0xFFFF
	// MinULPDU is the shortest ULPDU a DDP segment fits in (a tagged header).
	MinULPDU = 14
)

// PadLen returns the number of zero bytes after a ULPDU of ulpduLen bytes
// that make 2 + ULPDU + pad a multiple of 4.
func PadLen(ulpduLen int) int { return -(HeaderLen + ulpduLen) & 3 }

// FPDULen returns the size of an FPDU without markers: length field, ULPDU,
// pad and CRC.
func FPDULen(ulpduLen int) int { return HeaderLen + ulpduLen + PadLen(ulpduLen) + CRCLen }

// MULPDU returns the largest ULPDU that fits an FPDU in one TCP segment of
// EMSS bytes (RFC 5044's MULPDU): EMSS - (6 + EMSS mod 4) without markers and
// EMSS - (6 + 4*ceil(EMSS/512) + EMSS mod 4) with them, clamped to
// 0..MaxULPDU.
func MULPDU(emss int, markers bool) int {
	if emss <= 0 {
		return 0
	}
	over := HeaderLen + CRCLen + emss%4
	if markers {
		over += MarkerLen * ((emss + MarkerInterval - 1) / MarkerInterval)
	}
	return max(0, min(emss-over, MaxULPDU))
}

// AppendFPDU appends one FPDU without markers whose ULPDU is hdr followed by
// payload (see Writer): the big-endian ULPDU_LENGTH, hdr, payload (copied
// and checksummed in one pass), the zero pad and the CRC32c of everything
// before it, least significant byte first (four zero bytes when crc is
// false). len(hdr)+len(payload) must not exceed MaxULPDU.
func AppendFPDU(dst, hdr, payload []byte, crc bool) []byte {
	w := Writer{buf: dst, crc: crc}
	w.Append(hdr, payload)
	return w.buf
}
