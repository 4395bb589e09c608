package store

import (
	"encoding/binary"
	"fmt"
)

// Key layout of the badger store. The first byte says what a key is.
const (
	prefixFormat  byte = 0x00 // prefixFormat: format marker (value: formatMagic)
	prefixLastID  byte = 0x01 // prefixLastID: last volume id assigned (4 bytes BE)
	prefixVolume  byte = 0x02 // prefixVolume | name: volume record
	prefixDeleted byte = 0x03 // prefixDeleted | id (4 BE): blocks still to be reaped
	prefixBlock   byte = 0x10 // prefixBlock | id (4 BE) | lba (8 BE): one block

	blockKeyLen  = 1 + 4 + 8
	volPrefixLen = 1 + 4
)

// formatMagic is the value of the format marker key.
const formatMagic = "rnic-store v1"

var (
	formatKey = []byte{prefixFormat}
	lastIDKey = []byte{prefixLastID}
)

// blockKey is the badger key of one block: prefixBlock | volume id | lba,
// big-endian, so a volume's blocks are contiguous and in lba order.
type blockKey []byte

// newBlockKey returns the key of block lba of volume id.
func newBlockKey(id uint32, lba uint64) blockKey {
	k := make(blockKey, blockKeyLen)
	k.Set(id, lba)
	return k
}

// Set makes k (blockKeyLen bytes) the key of block lba of volume id.
func (k blockKey) Set(id uint32, lba uint64) {
	k[0] = prefixBlock
	binary.BigEndian.PutUint32(k[1:5], id)
	binary.BigEndian.PutUint64(k[5:13], lba)
}

// Volume returns the volume id of the key.
func (k blockKey) Volume() uint32 { return binary.BigEndian.Uint32(k[1:5]) }

// LBA returns the block number of the key.
func (k blockKey) LBA() uint64 { return binary.BigEndian.Uint64(k[5:13]) }

// SetLBA changes the block number of the key in place.
func (k blockKey) SetLBA(lba uint64) { binary.BigEndian.PutUint64(k[5:13], lba) }

// parseBlockKey checks that b is a block key of volume id.
func parseBlockKey(b []byte, id uint32) (blockKey, error) {
	k := blockKey(b)
	if len(b) != blockKeyLen || b[0] != prefixBlock || k.Volume() != id {
		return nil, fmt.Errorf("unexpected key %x in volume %d: %w", b, id, ErrCorrupt)
	}
	return k, nil
}

// volumeBlocksPrefix returns prefixBlock | id: the prefix of all blocks of
// volume id.
func volumeBlocksPrefix(id uint32) []byte {
	p := make([]byte, volPrefixLen)
	p[0] = prefixBlock
	binary.BigEndian.PutUint32(p[1:], id)
	return p
}

// volumeKey returns the key of the record of volume name.
func volumeKey(name string) []byte {
	return append([]byte{prefixVolume}, name...)
}

// deletedKey returns the key marking volume id's blocks for reaping.
func deletedKey(id uint32) []byte {
	k := make([]byte, volPrefixLen)
	k[0] = prefixDeleted
	binary.BigEndian.PutUint32(k[1:], id)
	return k
}
