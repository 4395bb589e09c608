package rnic

import (
	"testing"
	"time"
)

// TestClearDropsWindowsFirst: Device.Close's clear of the STag table does
// not drop a region's mapping while a placement through one of its
// windows holds the window's lock (remoteAccess hands out the region's
// mapping under the window's lock alone). The region comes before its
// window in the table here, the order clear used to take them in.
func TestClearDropsWindowsFirst(t *testing.T) {
	n := uint32(0)
	tab := newStagTable(1024, func() uint32 { n++; return n })
	buf := make([]byte, 4096)
	mr := &stagEntry{kind: kindMR, valid: true, mem: newMapping(Memory{Pages: [][]byte{buf}}), length: 4096}
	mw := &stagEntry{kind: kindMW, valid: true, mr: mr, length: 4096}
	for _, e := range []*stagEntry{mr, mw} {
		if err := tab.alloc(e); err != nil {
			t.Fatal(err)
		}
	}
	if mr.index&(1<<tab.slotBits-1) > mw.index&(1<<tab.slotBits-1) {
		t.Fatalf("the region's slot follows the window's: the test needs the other order")
	}

	mw.mu.RLock() // a placement through the window is copying
	done := make(chan struct{})
	go func() {
		tab.clear()
		close(done)
	}()
	// clear must not reach the region before the window. This bound only
	// ends the watch: clear waits for the window's lock.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		mr.mu.RLock()
		gone := mr.gone
		mr.mu.RUnlock()
		if gone {
			mw.mu.RUnlock()
			<-done
			t.Fatal("the region's mapping was dropped while a placement through its window held the window")
		}
	}
	mw.mu.RUnlock()
	<-done
	for _, e := range []*stagEntry{mr, mw} {
		if !e.gone || e.valid || e.mem.len != 0 {
			t.Errorf("entry %d after clear: gone %v valid %v mapping of %d bytes", e.kind, e.gone, e.valid, e.mem.len)
		}
	}
}
