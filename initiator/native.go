package initiator

import "encoding/binary"

// nativeUint64 reads an atomic's result: the RNIC stores the original
// value in the host's byte order.
func nativeUint64(b []byte) uint64 { return binary.NativeEndian.Uint64(b) }
