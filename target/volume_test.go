package target

import (
	"sync/atomic"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
)

// TestReleaseSlotTokenAboveFloor: an ended session's slot is released
// while another session spins on taking the lock it held, as
// initiator.TryLock does with RDMA atomics (Compare-and-Swap of the lock
// word, then Fetch-and-Add of the generation for its token), which the
// RNIC runs without the target's locks. Whenever the new holder gets the
// lock, its token must be above the fence floor the release raised: a
// release that cleared the lock before it raised the floor let the new
// holder draw its token in between, stale from its first write.
func TestReleaseSlotTokenAboveFloor(t *testing.T) {
	const dead, live = 3, 4
	for round := range 3000 {
		vol := &volume{words: make([]uint64, blockproto.LockTableLen(4)/8)}
		gen := &vol.words[blockproto.WordGeneration]
		atomic.StoreUint64(gen, 1000)
		vol.floor = 1000
		w := &vol.words[blockproto.FirstLockWord]
		atomic.StoreUint64(w, blockproto.LockValue(dead, 1))
		vol.slots[dead] = &session{}
		token := make(chan uint64)
		go func() {
			for !atomic.CompareAndSwapUint64(w, 0, blockproto.LockValue(live, 1)) {
			}
			token <- atomic.AddUint64(gen, 1)
		}()
		if n := vol.releaseSlot(dead); n != 1 {
			t.Fatalf("round %d: released %d locks, want 1", round, n)
		}
		tok := <-token
		vol.fence.RLock()
		floor := vol.floor
		vol.fence.RUnlock()
		if g := atomic.LoadUint64(gen); blockproto.Stale(tok, floor, g) {
			t.Fatalf("round %d: the new holder's token %d is stale: floor %d, generation %d", round, tok, floor, g)
		}
	}
}
