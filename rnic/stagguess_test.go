package rnic

import (
	"math/rand/v2"
	"testing"
)

// TestSTagGuessing: 1e6 random (STag, TO) guesses against a device holding
// 64 live remote-writable STags (a target's write grants), through the same
// lookup and access check that every inbound tagged segment takes: none
// gets access unless it is a live STag, key included. An STag is a 24-bit index (slot | random high bits) and an
// 8-bit key, so a blind guess names a live index with probability 64/2^24
// and then still needs the key and a TO inside the region; and on the wire
// a failed guess costs the guesser its connection (TestHostilePeers).
func TestSTagGuessing(t *testing.T) {
	const live, guesses = 64, 1_000_000
	_, pd, _, qp, _, _ := idleQP(t, 16, 16)
	var stags []STag
	for i := 0; i < live; i++ {
		mr, err := pd.RegisterMR(Bytes(make([]byte, 64<<10)), MROptions{Access: LocalWrite | RemoteWrite, ZeroBased: true,
			Key: pd.dev.RandomKey()})
		if err != nil {
			t.Fatal(err)
		}
		stags = append(stags, mr.STag())
	}
	try := func(s STag, to uint64) (indexHit, ok bool) {
		e := pd.dev.stags.lookup(s)
		if e == nil {
			return false, false
		}
		e.mu.RLock()
		_, _, f := e.remoteAccess(qp, s, to, 4096, RemoteWrite)
		e.mu.RUnlock()
		return true, f == faultNone
	}
	// The check accepts what it should.
	for _, s := range stags {
		if _, ok := try(s, 4096); !ok {
			t.Fatalf("live STag %v refused", s)
		}
	}
	r := rand.New(rand.NewPCG(0x5eed, 0xcafe))
	isLive := map[STag]bool{}
	for _, s := range stags {
		isLive[s] = true
	}
	// A guess that is a live STag, key included, gets access as it should:
	// with random keys that happens about once in a few hundred runs, and
	// is counted apart. Every other success is a hole.
	var indexHits, exact, successes int
	for i := 0; i < guesses; i++ {
		g := STag(r.Uint32())
		hit, ok := try(g, r.Uint64()&((1<<20)-1)) // TOs near the regions, to give guesses a chance
		if hit {
			indexHits++
		}
		switch {
		case ok && isLive[g]:
			exact++
		case ok:
			successes++
		}
	}
	// Knowing a live index (e.g. a stale STag from an earlier request),
	// the key is still an 8-bit guess; after invalidation, nothing works.
	keyHits := 0
	for i := 0; i < 10_000; i++ {
		s := stags[i%live]
		if _, ok := try(s.WithKey(s.Key()+uint8(1+r.IntN(255))), 0); ok {
			keyHits++
		}
	}
	t.Logf("%d random guesses: %d named a live index, %d were a live STag (index and key), %d other got access; "+
		"10000 wrong-key guesses on live indexes: %d got access", guesses, indexHits, exact, successes, keyHits)
	if successes != 0 || keyHits != 0 {
		t.Fatalf("%d blind guesses and %d wrong-key guesses got access", successes, keyHits)
	}
}
