package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator/nbd"
)

// crash brings the target down as a crash or a power cut would: its
// connections end without GOODBYE, so the initiator cannot tell that the
// writes it acknowledged were synced.
func (tt *testTarget) crash() {
	tt.l.Close()
	tt.dev.Close()
	<-tt.served
	tt.tg = nil
}

// TestNBDFlushAfterWritesLostOnEveryConnection: after the target crashed
// (restarted without a clean shutdown), the writes it had acknowledged
// since the last flush may be lost; the initiator reports that to the
// first Flush (ErrWritesLost) and then clears it. With several NBD
// connections on the one initiator (multi-conn, or several clients of one
// export), the first FLUSH, on whatever connection, gets EIO; a FLUSH on
// another connection whose client had writes acknowledged before the
// crash must not succeed either: NBD_CMD_FLUSH may succeed only once the
// writes acknowledged to that client are durable, and those may be gone.
// A connection that wrote nothing unflushed flushes fine.
func TestNBDFlushAfterWritesLostOnEveryConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts targets and rinit")
	}
	r := rinitOnMemTarget(t)
	a, b, idle := dialUnix(t, r.sock), dialUnix(t, r.sock), dialUnix(t, r.sock)
	data := bytes.Repeat([]byte("lost? "), 4096/6+1)[:4096]
	for _, c := range []*nbdUnix{a, b} {
		if errno, _, err := c.do(nbd.CmdWrite, 8192, 4096, data); errno != 0 || err != nil {
			t.Fatalf("WRITE: errno %d, %v", errno, err)
		}
	}
	r.tt.crash()
	r.tt = startTarget(t, r.st, r.tt.addr)
	if errno, _, err := a.do(nbd.CmdFlush, 0, 0, nil); errno != nbd.EIO || err != nil {
		t.Fatalf("first FLUSH after the crash: errno %d, %v, want EIO\n%s", errno, err, r.log)
	}
	if errno, _, err := b.do(nbd.CmdFlush, 0, 0, nil); errno != nbd.EIO || err != nil {
		t.Fatalf("FLUSH of the other connection that wrote before the crash: errno %d, %v, want EIO", errno, err)
	}
	if errno, _, err := idle.do(nbd.CmdFlush, 0, 0, nil); errno != 0 || err != nil {
		t.Fatalf("FLUSH of a connection that wrote nothing: errno %d, %v, want success", errno, err)
	}
	// Reported once per connection: flushed again, and after new writes,
	// they succeed.
	for _, c := range []*nbdUnix{a, b} {
		if errno, _, err := c.do(nbd.CmdWrite, 0, 4096, data); errno != 0 || err != nil {
			t.Fatalf("WRITE after the crash: errno %d, %v", errno, err)
		}
		if errno, _, err := c.do(nbd.CmdFlush, 0, 0, nil); errno != 0 || err != nil {
			t.Fatalf("second FLUSH after the crash: errno %d, %v, want success", errno, err)
		}
	}
	select {
	case err := <-r.done:
		t.Fatalf("rinit nbd ended: %v\n%s", err, r.log)
	case <-time.After(50 * time.Millisecond):
	}
}
