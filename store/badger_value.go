package store

import (
	"encoding/binary"
	"fmt"

	"github.com/rnic-dev/rnic/rnic/crc32c"
)

// blockValueLen is the length of a stored block value: a CRC-32C of the
// block's data, big-endian, followed by the data.
const blockValueLen = 4 + BlockSize

// blockValue is a stored block value: crc32c(data) (4 bytes BE) | data.
type blockValue []byte

// CRC returns the stored checksum.
func (v blockValue) CRC() uint32 { return binary.BigEndian.Uint32(v[:4]) }

// Data returns the block's bytes.
func (v blockValue) Data() []byte { return v[4:blockValueLen] }

// encodeBlockValue fills v (blockValueLen bytes) with src (BlockSize bytes)
// and its checksum, computed while copying.
func encodeBlockValue(v blockValue, src []byte) {
	crc := crc32c.UpdateCopy(0, v[4:blockValueLen], src[:BlockSize])
	binary.BigEndian.PutUint32(v[:4], crc)
}

// decodeBlockValue copies the data of stored value b into dst (BlockSize
// bytes) after checking its length and checksum. On any mismatch dst is
// zeroed and the error wraps ErrChecksum.
func decodeBlockValue(dst, b []byte) error {
	if len(b) != blockValueLen {
		clear(dst[:BlockSize])
		return fmt.Errorf("stored value is %d bytes, want %d: %w", len(b), blockValueLen, ErrChecksum)
	}
	v := blockValue(b)
	got := crc32c.UpdateCopy(0, dst[:BlockSize], v.Data())
	if want := v.CRC(); got != want {
		clear(dst[:BlockSize])
		return fmt.Errorf("crc32c %08x, stored %08x: %w", got, want, ErrChecksum)
	}
	return nil
}
