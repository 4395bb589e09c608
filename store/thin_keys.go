package store

import (
	"encoding/binary"
	"fmt"
)

// Key layout of the thin store's metadata database (see doc.go). The first
// byte says what a key is; numbers are big-endian, so a volume's map and a
// snapshot's delta are contiguous and in cluster order.
const (
	tkFormat   byte = 0x00 // format record (JSON thinFormat)
	tkLastID   byte = 0x01 // last volume id assigned (4 bytes)
	tkVolume   byte = 0x02 // | name: volume record (JSON thinRecord)
	tkVolumeID byte = 0x03 // | id: the volume's name
	tkReap     byte = 0x04 // | id: a deleted volume whose map and deltas are still to be released
	tkHigh     byte = 0x05 // clusters in use in the data files, the header cluster included (8 bytes)
	tkOpen     byte = 0x06 // present while a store is open: its absence at open means the last close was clean
	tkSnap     byte = 0x07 // | id | epoch: a snapshot of volume id (JSON thinSnap)
	tkMap      byte = 0x10 // | id | cluster: head map entry (8 bytes)
	tkDelta    byte = 0x11 // | id | epoch (4) | cluster: snapshot delta entry (8 bytes)
	tkRef      byte = 0x12 // | physical cluster: reference count when above 1 (4 bytes)
	tkFree     byte = 0x13 // | first physical cluster: end of a free range (8 bytes)
)

var (
	thinFormatKey = []byte{tkFormat}
	thinLastIDKey = []byte{tkLastID}
	thinHighKey   = []byte{tkHigh}
	thinOpenKey   = []byte{tkOpen}
)

func thinVolumeKey(name string) []byte { return append([]byte{tkVolume}, name...) }

func idKey(prefix byte, id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefix}, id)
}

func mapKey(id uint32, c uint64) []byte {
	return binary.BigEndian.AppendUint64(idKey(tkMap, id), c)
}

func snapKey(id, epoch uint32) []byte {
	return binary.BigEndian.AppendUint32(idKey(tkSnap, id), epoch)
}

// deltaPrefix is the prefix of snapshot epoch's delta of volume id.
func deltaPrefix(id, epoch uint32) []byte {
	return binary.BigEndian.AppendUint32(idKey(tkDelta, id), epoch)
}

func deltaKey(id, epoch uint32, c uint64) []byte {
	return binary.BigEndian.AppendUint64(deltaPrefix(id, epoch), c)
}

func refKey(p uint64) []byte  { return binary.BigEndian.AppendUint64([]byte{tkRef}, p) }
func freeKey(p uint64) []byte { return binary.BigEndian.AppendUint64([]byte{tkFree}, p) }

// keyCluster returns the cluster number that ends a map or delta key.
func keyCluster(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }

func u64(b []byte) []byte { return b[:8:8] }

func putU64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(what string, b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%s: %d bytes, want 8: %w", what, len(b), ErrCorrupt)
	}
	return binary.BigEndian.Uint64(b), nil
}
