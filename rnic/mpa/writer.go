package mpa

import (
	"encoding/binary"
	"fmt"

	"github.com/rnic-dev/rnic/rnic/crc32c"
)

// Writer frames FPDUs without markers (RFC 5044 §4) into one buffer, the
// batch, which holds as many FPDUs as the caller puts in before it writes
// the batch to the connection in one call. Per FPDU the caller calls Begin
// with the ULPDU's headers and the number of payload bytes that follow, then
// Payload for each piece of that payload (the pieces of a scatter-gather
// list, the spans of a memory region), then End, which appends the pad and
// the CRC. Payload copies and checksums in one pass (crc32c.UpdateCopy): the
// payload is read once, from where it lives straight into the batch.
//
// The Writer never touches a connection: the caller writes Bytes when it
// chooses and then calls Reset. One goroutine owns a Writer.
type Writer struct {
	buf    []byte
	crc    bool
	start  int    // offset in buf of the FPDU being built
	end    int    // offset in buf where its ULPDU ends
	sum    uint32 // CRC32c so far of the FPDU being built
	inFPDU bool
}

// NewWriter returns a Writer whose batch has room for size bytes before it
// grows. With crc false the CRC field is sent as zeros and nothing is
// checksummed.
func NewWriter(size int, crc bool) *Writer {
	return &Writer{buf: make([]byte, 0, size), crc: crc}
}

// Bytes returns the batch: the FPDUs ended since the last Reset (and the
// part built so far of one begun and not yet ended). It is valid until the
// next call that modifies the Writer.
func (w *Writer) Bytes() []byte { return w.buf }

// Len returns the number of bytes in the batch.
func (w *Writer) Len() int { return len(w.buf) }

// Available returns how many bytes the batch takes before it must grow.
func (w *Writer) Available() int { return cap(w.buf) - len(w.buf) }

// Fits reports whether an FPDU with a ULPDU of ulpduLen bytes fits in the
// batch without growing it.
func (w *Writer) Fits(ulpduLen int) bool { return w.Available() >= FPDULen(ulpduLen) }

// Reset empties the batch, keeping its buffer. An FPDU begun and not ended
// is dropped.
func (w *Writer) Reset() {
	w.buf = w.buf[:0]
	w.inFPDU = false
}

// Begin starts an FPDU whose ULPDU is hdr followed by n payload bytes: it
// appends ULPDU_LENGTH and hdr and reserves room for the rest of the FPDU,
// growing the batch if it has less than FPDULen(len(hdr)+n) bytes
// available, so that Payload and End never reallocate. An FPDU begun and
// not ended is dropped. len(hdr)+n must not exceed MaxULPDU.
func (w *Writer) Begin(hdr []byte, n int) {
	if w.inFPDU {
		w.Abandon()
	}
	ulpdu := len(hdr) + n
	if ulpdu > MaxULPDU || n < 0 {
		panic(fmt.Sprintf("mpa: ULPDU of %d bytes exceeds %d", ulpdu, MaxULPDU))
	}
	if !w.Fits(ulpdu) {
		nb := make([]byte, len(w.buf), len(w.buf)+FPDULen(ulpdu)+len(w.buf)/4)
		copy(nb, w.buf)
		w.buf = nb
	}
	w.start = len(w.buf)
	w.end = w.start + HeaderLen + ulpdu
	w.buf = append(w.buf, byte(ulpdu>>8), byte(ulpdu))
	w.buf = append(w.buf, hdr...)
	if w.crc {
		w.sum = crc32c.Update(0, w.buf[w.start:])
	}
	w.inFPDU = true
}

// Payload appends p to the ULPDU being built. Together the pieces must not
// exceed the n given to Begin.
func (w *Writer) Payload(p []byte) {
	n := len(w.buf)
	if !w.inFPDU || n+len(p) > w.end {
		panic(fmt.Sprintf("mpa: %d payload bytes past the end of the ULPDU being built", n+len(p)-w.end))
	}
	w.buf = w.buf[:n+len(p)]
	if w.crc {
		w.sum = crc32c.UpdateCopy(w.sum, w.buf[n:], p)
	} else {
		copy(w.buf[n:], p)
	}
}

// End appends the zero pad and the CRC32c of the FPDU (least significant
// byte first; zeros when CRCs are off). The payload must be complete.
func (w *Writer) End() {
	n := len(w.buf)
	if !w.inFPDU || n != w.end {
		panic(fmt.Sprintf("mpa: FPDU ended with %d of its payload bytes missing", w.end-n))
	}
	pad := PadLen(n - w.start - HeaderLen)
	w.buf = w.buf[:n+pad+CRCLen]
	clear(w.buf[n : n+pad])
	var sum uint32
	if w.crc {
		sum = crc32c.Update(w.sum, w.buf[n:n+pad])
	}
	binary.LittleEndian.PutUint32(w.buf[n+pad:], sum)
	w.inFPDU = false
}

// Abandon drops the FPDU being built, leaving the batch as it was before
// Begin.
func (w *Writer) Abandon() {
	if w.inFPDU {
		w.buf = w.buf[:w.start]
		w.inFPDU = false
	}
}

// Append frames one whole FPDU whose ULPDU is hdr followed by payload.
func (w *Writer) Append(hdr, payload []byte) {
	w.Begin(hdr, len(payload))
	w.Payload(payload)
	w.End()
}
