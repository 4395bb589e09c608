package rnic

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// Memory is what a memory region maps: either one contiguous Go buffer, or a
// physical buffer list of equally sized pages (draft §7.6.2, page-list mode)
// with a first byte offset. The Go runtime never moves heap memory, and the
// region keeps its buffers referenced, which is this RNIC's "pinning".
type Memory struct {
	// Pages holds the buffers. With PageSize 0 it holds exactly one buffer,
	// used as one contiguous block.
	Pages [][]byte
	// PageSize is the size of every page (a power of two) in page-list mode,
	// or 0 for a single contiguous buffer.
	PageSize int
	// FBO is the offset of the region's first byte in the first buffer.
	FBO int
	// Len is the region's length in bytes.
	Len uint64
}

// Bytes makes a contiguous Memory over b.
func Bytes(b []byte) Memory { return Memory{Pages: [][]byte{b}, Len: uint64(len(b))} }

// validate checks the buffer list's shape and reports a Status naming the
// first problem.
func (m *Memory) validate(maxPages int) (Status, error) {
	if len(m.Pages) == 0 {
		return StatusInvalidPBLEntry, fmt.Errorf("%w: empty buffer list", ErrInvalidPBLEntry)
	}
	if maxPages > 0 && len(m.Pages) > maxPages {
		return StatusPBLTooLong, fmt.Errorf("%w: %d buffers, at most %d", ErrInvalidPBLEntry, len(m.Pages), maxPages)
	}
	if m.FBO < 0 {
		return StatusInvalidFBO, ErrInvalidFBO
	}
	if m.PageSize == 0 {
		if len(m.Pages) != 1 {
			return StatusInvalidBufferSize, fmt.Errorf("%w: a contiguous region has exactly one buffer", ErrInvalidBufferSize)
		}
		if m.FBO > len(m.Pages[0]) {
			return StatusInvalidFBO, ErrInvalidFBO
		}
		if m.Len > uint64(len(m.Pages[0])-m.FBO) {
			return StatusInvalidLength, fmt.Errorf("%w: %d bytes from offset %d of a %d-byte buffer", ErrInvalidLength, m.Len, m.FBO, len(m.Pages[0]))
		}
		return StatusSuccess, nil
	}
	if m.PageSize < 8 || m.PageSize&(m.PageSize-1) != 0 {
		return StatusInvalidPageSize, fmt.Errorf("%w: page size %d is not a power of two >= 8", ErrInvalidBufferSize, m.PageSize)
	}
	if m.FBO >= m.PageSize {
		return StatusInvalidFBO, ErrInvalidFBO
	}
	for i, p := range m.Pages {
		if len(p) != m.PageSize {
			return StatusInvalidPBLEntry, fmt.Errorf("%w: buffer %d has %d bytes, page size %d", ErrInvalidPBLEntry, i, len(p), m.PageSize)
		}
	}
	if m.Len > uint64(len(m.Pages))*uint64(m.PageSize)-uint64(m.FBO) {
		return StatusInvalidLength, fmt.Errorf("%w: %d bytes do not fit %d pages", ErrInvalidLength, m.Len, len(m.Pages))
	}
	return StatusSuccess, nil
}

// mapping is the engine's resolved form of a Memory.
type mapping struct {
	pages [][]byte
	shift uint   // log2(page size); 0 for contiguous
	mask  uint64 // page size - 1
	fbo   uint64
	len   uint64
}

func newMapping(m Memory) mapping {
	mp := mapping{pages: m.Pages, fbo: uint64(m.FBO), len: m.Len}
	if m.PageSize != 0 {
		mp.shift = uint(bits.TrailingZeros(uint(m.PageSize)))
		mp.mask = uint64(m.PageSize) - 1
	}
	return mp
}

// span returns the longest contiguous slice of at most n bytes starting at
// region offset off. The caller has checked off+n <= len.
func (m *mapping) span(off uint64, n uint64) []byte {
	abs := m.fbo + off
	if m.shift == 0 {
		return m.pages[0][abs : abs+n]
	}
	p := m.pages[abs>>m.shift]
	in := abs & m.mask
	end := in + n
	if end > uint64(len(p)) {
		end = uint64(len(p))
	}
	return p[in:end]
}

// copyIn copies src into the region at off (bounds already checked).
func (m *mapping) copyIn(off uint64, src []byte) {
	for len(src) > 0 {
		d := m.span(off, uint64(len(src)))
		n := copy(d, src)
		src = src[n:]
		off += uint64(n)
	}
}

// copyOut copies from the region at off into dst (bounds already checked).
func (m *mapping) copyOut(dst []byte, off uint64) {
	for len(dst) > 0 {
		s := m.span(off, uint64(len(dst)))
		n := copy(dst, s)
		dst = dst[n:]
		off += uint64(n)
	}
}

// word returns the 8-byte word at off for an atomic operation, or nil if its
// address in memory is not 8-byte aligned or it straddles buffers.
func (m *mapping) word(off uint64) *uint64 {
	s := m.span(off, 8)
	if len(s) < 8 {
		return nil
	}
	p := unsafe.Pointer(&s[0])
	if uintptr(p)%8 != 0 {
		return nil
	}
	return (*uint64)(p)
}
