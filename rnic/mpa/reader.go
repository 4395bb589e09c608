package mpa

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/rnic-dev/rnic/rnic/crc32c"
	"github.com/rnic-dev/rnic/rnic/term"
)

// ReaderConfig configures a Reader.
type ReaderConfig struct {
	// CRC: verify the CRC32c trailer of every FPDU. When false the trailer
	// is read and ignored, and no CRC is computed.
	CRC bool
	// Markers: the peer inserts markers into the stream towards us; they
	// are checked, stripped and covered by the CRC. Stream offset 0 (the
	// first marker) is the first byte after the MPA Request/Reply frames,
	// so the Reader must be created at that point of the stream.
	Markers bool
	// MaxULPDU is the largest ULPDU_LENGTH accepted; 0 means MaxULPDU.
	MaxULPDU int
	// BufSize is the size of the receive buffer; 0 means 64 KiB.
	BufSize int
}

const (
	defaultBufSize = 64 << 10
	minBufSize     = 64
	// directMin is the size from which ReadFull reads the connection
	// straight into the caller's slice when nothing is buffered.
	directMin = 4 << 10
	// directTail is how much of the stream after a direct read a VecReader
	// source reads into the buffer in the same call: the trailer and the
	// next FPDU's headers, so that a stream of large FPDUs is placed
	// directly one FPDU after another, one read each. Small, so that the
	// next FPDU's payload goes direct too.
	directTail = 512
	// directBig is the ULPDU size from which the Reader streams: while
	// FPDUs this large follow one another, it fills its buffer only
	// directTail bytes at a time, so that their payloads go direct instead
	// of through a buffer full of read-ahead. Small FPDUs (inline 4 KiB
	// messages, say) keep the large reads that take a burst in one call.
	directBig = 32 << 10
	// maxEmptyReads bounds successive (0, nil) reads, as bufio does.
	maxEmptyReads = 100
)

// VecReader is a stream source that reads into two slices in one call,
// filling a before b (readv(2)); n counts the bytes of both. Like Read it
// returns what is available, at least one byte, or an error. A Reader whose
// source implements it places large payloads straight into the caller's
// slice and reads the bytes that follow into its buffer in the same call.
type VecReader interface {
	ReadVec(a, b []byte) (n int, err error)
}

// NoWaitReader is a stream source that can read without waiting:
// TryReadVec is ReadVec, except that when nothing is there now it returns
// (0, ErrWouldBlock) at once. ReadSome reads through it.
type NoWaitReader interface {
	TryReadVec(a, b []byte) (n int, err error)
}

// Reader parses the FPDU stream of one MPA connection in full operation.
// One goroutine owns it. Per FPDU the caller calls Next, then ReadFull and
// Discard for the ULPDU bytes it wants, then Finish, which checks the CRC.
// The CRC is therefore known only at Finish: callers may place payload
// before it and must not act on it if Finish fails.
//
// Reads from the connection are large (up to BufSize), except while large
// FPDUs stream from a VecReader (see directBig), and never go past what is
// needed for an FPDU, except into the Reader's own buffer.
//
// Errors are sticky. Protocol errors are *term.Error with the LLP / MPA
// cause: CRC mismatch 0x02, ULPDU_LENGTH out of range or a bad marker 0x03.
// The stream ending at an FPDU boundary is io.EOF; ending inside one is
// io.ErrUnexpectedEOF; other I/O errors are returned wrapped.
type Reader struct {
	r   io.Reader
	vr  VecReader    // r, when it can read vectored; else nil
	nw  NoWaitReader // r, when it can read without waiting; else nil
	cfg ReaderConfig
	buf []byte
	lo  int // buf[lo:hi] is buffered, unconsumed stream
	hi  int
	off uint64 // stream offset of buf[lo]

	crc    uint32
	remain int // ULPDU bytes not yet consumed
	// streaming: one of the last two FPDUs begun was at least directBig
	// bytes and the source reads vectored, so fills read little ahead (see
	// directBig); smallRun counts the small FPDUs since the last large one.
	streaming bool
	smallRun  int
	pad       int  // pad bytes after the ULPDU
	inFPDU    bool // between Next and Finish
	// inHeader: Next is taking an FPDU's header (a leading marker and
	// ULPDU_LENGTH) and has begun to consume it: the Reader is no longer
	// between FPDUs, though its buffer may be empty.
	inHeader bool
	// nowait: ReadSome is reading; the source is read through nw, and a
	// read that finds nothing ends it.
	nowait bool

	nextMarker uint64 // stream offset of the next marker (Markers only)
	fpduStart  uint64 // stream offset where the current FPDU begins
	leadMarker bool   // the current FPDU begins with a marker

	scratch [4]byte // length field and CRC trailer (kept here so they do not escape)

	readErr error // error returned by r, delivered when the buffer is empty
	err     error // sticky error
}

// NewReader returns a Reader of the FPDU stream r.
func NewReader(r io.Reader, cfg ReaderConfig) *Reader {
	if cfg.MaxULPDU <= 0 || cfg.MaxULPDU > MaxULPDU {
		cfg.MaxULPDU = MaxULPDU
	}
	if cfg.BufSize <= 0 {
		cfg.BufSize = defaultBufSize
	}
	cfg.BufSize = max(cfg.BufSize, minBufSize)
	vr, _ := r.(VecReader)
	nw, _ := r.(NoWaitReader)
	return &Reader{r: r, vr: vr, nw: nw, cfg: cfg, buf: make([]byte, cfg.BufSize)}
}

// Reset discards all state, including any error and buffered bytes, and
// makes r read a new stream from src, keeping its buffer and configuration.
func (r *Reader) Reset(src io.Reader) {
	vr, _ := src.(VecReader)
	nw, _ := src.(NoWaitReader)
	*r = Reader{r: src, vr: vr, nw: nw, cfg: r.cfg, buf: r.buf}
}

// Buffered returns the number of stream bytes read from the connection and
// not yet consumed (markers included).
func (r *Reader) Buffered() int { return r.hi - r.lo }

// Remaining returns the ULPDU bytes of the current FPDU not yet consumed.
func (r *Reader) Remaining() int { return r.remain }

// fail records a sticky error.
func (r *Reader) fail(err error) error {
	r.err = err
	return err
}

// fill reads more of the stream into the buffer. At end of stream it
// returns io.EOF.
func (r *Reader) fill() error {
	if r.lo == r.hi {
		r.lo, r.hi = 0, 0
	}
	if r.readErr != nil {
		return r.readErr
	}
	if r.hi == len(r.buf) {
		r.hi = copy(r.buf, r.buf[r.lo:r.hi])
		r.lo = 0
	}
	end := len(r.buf)
	if r.streaming {
		end = min(end, r.hi+directTail)
	}
	for range maxEmptyReads {
		idle := r.Idle()
		var n int
		var err error
		if r.nowait {
			n, err = r.nw.TryReadVec(r.buf[r.hi:end], nil)
		} else {
			n, err = r.r.Read(r.buf[r.hi:end])
		}
		if err == ErrWouldBlock && n == 0 && (idle || r.nowait) {
			return err // not sticky: see ErrWouldBlock and ReadSome
		}
		r.hi += n
		if err != nil {
			r.readErr = err
			if n > 0 {
				return nil
			}
			return err
		}
		if n > 0 {
			return nil
		}
	}
	r.readErr = io.ErrNoProgress
	return r.readErr
}

// need makes at least n bytes (n <= len(buf)) buffered.
func (r *Reader) need(n int) error {
	for r.hi-r.lo < n {
		if r.lo > 0 && len(r.buf)-r.lo < n {
			r.hi = copy(r.buf, r.buf[r.lo:r.hi])
			r.lo = 0
		}
		if err := r.fill(); err != nil {
			return err
		}
	}
	return nil
}

// midFPDU converts end of stream inside an FPDU into io.ErrUnexpectedEOF
// and wraps other read errors.
func midFPDU(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	var te *term.Error
	if errors.As(err, &te) {
		return err
	}
	return fmt.Errorf("mpa: reading FPDU: %w", err)
}

// marker consumes the marker at r.off, checks its FPDUPTR against the
// current FPDU's start and adds it to the CRC.
func (r *Reader) marker() error {
	if err := r.need(MarkerLen); err != nil {
		return err
	}
	m := r.buf[r.lo : r.lo+MarkerLen]
	ptr := uint64(binary.BigEndian.Uint16(m[2:4]) &^ 3) // low 2 bits are treated as zero
	at := r.off
	// FPDUPTR is the distance back to the FPDU the marker sits in. When
	// the FPDU begins with this marker it is 0. For later markers in an
	// FPDU that began with a marker, accept the distance to either the
	// leading marker or the ULPDU_LENGTH after it (RFC 5044's own text was
	// not available; Wireshark and OSC iWARP count from the FPDU start).
	ok := ptr == at-r.fpduStart || (r.leadMarker && ptr == at-r.fpduStart-MarkerLen)
	if !ok {
		return term.Errorf(term.LayerLLP, term.LLPMPA, term.MPAMarker,
			"marker at stream offset %d has FPDUPTR %d, the FPDU starts %d bytes back", at, ptr, at-r.fpduStart)
	}
	if r.cfg.CRC {
		r.crc = crc32c.Update(r.crc, m)
	}
	r.lo += MarkerLen
	r.off += MarkerLen
	r.nextMarker += MarkerInterval
	return nil
}

// consume moves n stream bytes, markers stripped, into dst (or drops them
// when dst is nil), adding them to the CRC when sum is set. On an error it
// returns how many it moved before it.
func (r *Reader) consume(dst []byte, n int, sum bool) (int, error) {
	sum = sum && r.cfg.CRC
	want := n
	for n > 0 {
		if r.cfg.Markers && r.off == r.nextMarker {
			if err := r.marker(); err != nil {
				return want - n, err
			}
			continue
		}
		avail := r.hi - r.lo
		if avail == 0 {
			if dst != nil && !r.cfg.Markers && n >= directMin && r.readErr == nil {
				// Large read, nothing buffered: straight into dst, and
				// what follows into the buffer when the source can.
				var k int
				var err error
				switch {
				case r.nowait:
					r.lo, r.hi = 0, 0
					k, err = r.nw.TryReadVec(dst[:n], r.buf[:min(directTail, len(r.buf))])
				case r.vr != nil:
					r.lo, r.hi = 0, 0
					k, err = r.vr.ReadVec(dst[:n], r.buf[:min(directTail, len(r.buf))])
				default:
					k, err = r.r.Read(dst[:n])
				}
				if k > n {
					r.hi = k - n
					k = n
				}
				if k > 0 {
					if sum {
						r.crc = crc32c.Update(r.crc, dst[:k])
					}
					dst, n, r.off = dst[k:], n-k, r.off+uint64(k)
				}
				if err == ErrWouldBlock && k == 0 && r.nowait {
					return want - n, err // not sticky: see ReadSome
				}
				if err != nil {
					r.readErr = err
				}
				if k > 0 || err != nil {
					continue
				}
			}
			if err := r.fill(); err != nil {
				return want - n, err
			}
			continue
		}
		k := min(avail, n)
		if r.cfg.Markers {
			k = min(k, int(r.nextMarker-r.off))
		}
		src := r.buf[r.lo : r.lo+k]
		switch {
		case dst != nil && sum:
			r.crc = crc32c.UpdateCopy(r.crc, dst, src)
		case dst != nil:
			copy(dst, src)
		case sum:
			r.crc = crc32c.Update(r.crc, src)
		}
		if dst != nil {
			dst = dst[k:]
		}
		r.lo += k
		r.off += uint64(k)
		n -= k
	}
	return want, nil
}

// Next finishes the current FPDU if the caller has not, then begins the
// next one and returns its ULPDU_LENGTH. A length below MinULPDU (no DDP
// header fits) or above MaxULPDU is LLP / MPA / 0x03: the framing is lost.
func (r *Reader) Next() (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.inFPDU {
		if err := r.Finish(); err != nil {
			return 0, err
		}
	}
	if r.hi == r.lo {
		if err := r.fill(); err != nil {
			if err == ErrWouldBlock {
				return 0, err
			}
			if err == io.EOF {
				return 0, r.fail(io.EOF)
			}
			return 0, r.fail(fmt.Errorf("mpa: reading FPDU: %w", err))
		}
	}
	r.fpduStart = r.off
	r.leadMarker = r.cfg.Markers && r.off == r.nextMarker
	r.crc = 0
	lb := r.scratch[:HeaderLen]
	r.inHeader = true
	if _, err := r.consume(lb, HeaderLen, true); err != nil {
		return 0, r.fail(midFPDU(err))
	}
	r.inHeader = false
	n := int(binary.BigEndian.Uint16(lb))
	if n < MinULPDU || n > r.cfg.MaxULPDU {
		return 0, r.fail(term.Errorf(term.LayerLLP, term.LLPMPA, term.MPAMarker,
			"ULPDU_LENGTH %d at stream offset %d outside %d..%d", n, r.fpduStart, MinULPDU, r.cfg.MaxULPDU))
	}
	r.remain, r.pad, r.inFPDU = n, PadLen(n), true
	switch {
	case n >= directBig:
		r.streaming, r.smallRun = r.vr != nil && !r.cfg.Markers, 0
	case r.streaming:
		// One small FPDU between large ones (a reply among Read
		// Responses) does not end the stream; two in a row do.
		r.smallRun++
		r.streaming = r.smallRun < 2
	}
	return n, nil
}

var errBeyond = errors.New("mpa: read past the end of the ULPDU")

// ErrWouldBlock is what a stream source may return from Read, with no
// bytes, while the Reader is Idle, to make Next return at once: Next then
// returns it and nothing changes; the next call reads again. A
// NoWaitReader's TryReadVec returns it when nothing is there, and ReadSome
// then returns it. Returned anywhere else it is a read error like any
// other.
var ErrWouldBlock = errors.New("mpa: nothing to read now")

// Idle reports that the Reader is between FPDUs with nothing buffered: a
// read of the source now is for the next FPDU's first bytes.
func (r *Reader) Idle() bool { return !r.inFPDU && !r.inHeader && r.hi == r.lo }

// ReadFull reads the next len(p) ULPDU bytes into p, checksumming them as
// it copies. Asking for more than Remaining is an error.
func (r *Reader) ReadFull(p []byte) error {
	_, err := r.read(p, false)
	return err
}

// ReadSome is ReadFull that does not wait for the stream: it reads the
// next len(p) ULPDU bytes into p if they are there, or as many as are
// there, n, and then returns ErrWouldBlock. That error is not sticky: the
// FPDU goes on with the next ReadSome, ReadFull, Discard or Finish. It
// lets a caller that reads into memory it holds a lock on read only what
// has arrived, and wait for the rest without the lock. A source that is
// no NoWaitReader is read as by ReadFull, waiting.
func (r *Reader) ReadSome(p []byte) (n int, err error) { return r.read(p, r.nw != nil) }

// read is ReadFull, and with nowait ReadSome through r.nw.
func (r *Reader) read(p []byte, nowait bool) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if !r.inFPDU || len(p) > r.remain {
		return 0, fmt.Errorf("%w: %d bytes asked, %d left", errBeyond, len(p), r.remain)
	}
	r.nowait = nowait
	n, err := r.consume(p, len(p), true)
	r.nowait = false
	r.remain -= n
	switch {
	case err == nil:
		return n, nil
	case err == ErrWouldBlock && nowait:
		return n, err
	}
	return n, r.fail(midFPDU(err))
}

// Discard skips the next n ULPDU bytes (still checksummed).
func (r *Reader) Discard(n int) error {
	if r.err != nil {
		return r.err
	}
	if !r.inFPDU || n < 0 || n > r.remain {
		return fmt.Errorf("%w: %d bytes to discard, %d left", errBeyond, n, r.remain)
	}
	if _, err := r.consume(nil, n, true); err != nil {
		return r.fail(midFPDU(err))
	}
	r.remain -= n
	return nil
}

// Finish discards what is left of the ULPDU, reads the pad and the CRC and,
// when CRCs are on, verifies it: a mismatch is LLP / MPA / CRC error (0x02).
// Markers anywhere in the FPDU, including one just before the CRC, are
// covered by the CRC.
func (r *Reader) Finish() error {
	if r.err != nil {
		return r.err
	}
	if !r.inFPDU {
		return nil
	}
	if _, err := r.consume(nil, r.remain+r.pad, true); err != nil {
		return r.fail(midFPDU(err))
	}
	r.remain = 0
	cb := r.scratch[:CRCLen]
	if _, err := r.consume(cb, CRCLen, false); err != nil {
		return r.fail(midFPDU(err))
	}
	r.inFPDU = false
	if r.cfg.CRC {
		if got := binary.LittleEndian.Uint32(cb); got != r.crc {
			return r.fail(term.Errorf(term.LayerLLP, term.LLPMPA, term.MPACRC,
				"FPDU at stream offset %d: CRC32c 0x%08X received, 0x%08X computed", r.fpduStart, got, r.crc))
		}
	}
	return nil
}
