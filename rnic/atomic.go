package rnic

import (
	"sync/atomic"

	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// doAtomic executes an RFC 7306 atomic on an aligned 64-bit word of target
// memory and returns the original value. The word is in the host's native
// byte order (so local code reads it with atomic.LoadUint64), and the
// read-modify-write is a compare-and-swap loop: atomic against every other
// atomic on the device, from any QP (RFC 7306 §5.3), and against local
// sync/atomic users of the same word.
func doAtomic(w *uint64, r *rdmap.AtomicRequestFields) uint64 {
	for {
		old := atomic.LoadUint64(w)
		var nv uint64
		if r.AOpcode == rdmap.AtomicFetchAdd {
			nv = rdmap.FetchAdd(old, r.AddSwap, r.AddSwapMask)
		} else {
			nv = rdmap.CmpSwap(old, r.AddSwap, r.AddSwapMask, r.Compare, r.CompareMask)
		}
		if nv == old || atomic.CompareAndSwapUint64(w, old, nv) {
			return old
		}
	}
}
