package rnic

import (
	"testing"
)

// TestCloseWaitsForStreams: Device.Close returns only after the receive and
// transmit goroutines of its QPs ended, not as soon as it reset the
// connections.
func TestCloseWaitsForStreams(t *testing.T) {
	for i := 0; i < 10; i++ {
		a, b := newPair(t, pairOpts{}, nil)
		a.qp.mu.Lock()
		c := a.qp.conn
		a.qp.mu.Unlock()
		if err := a.dev.Close(); err != nil {
			t.Fatal(err)
		}
		for _, ch := range []chan struct{}{c.rxDone, c.txDone} {
			select {
			case <-ch:
			default:
				t.Fatalf("iteration %d: Close returned while a stream goroutine runs", i)
			}
		}
		if st := a.qp.State(); st != StateError {
			t.Fatalf("QP in %s after Close", st)
		}
		b.waitState(StateError)
	}
}
