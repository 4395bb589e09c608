package rnic

import (
	"testing"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// TestSendZeroLengthFirstSegment: a Send whose first segment carries no
// payload (MO 0, L clear) is continued by a segment at MO 0 again. That
// segment belongs to the message in progress: it must not take a second
// receive WQE (the first would never complete, not even flushed, and its
// place in the RQ would be lost for good).
func TestSendZeroLengthFirstSegment(t *testing.T) {
	tt := newTermTarget(t, QPConfig{}, 2, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	msn := p.NextMSN(rdmap.QNSend)
	sendULPDU(t, p, p.Untagged(rdmap.OpSend, false, 0, rdmap.QNSend, msn, 0, nil))
	sendULPDU(t, p, p.Untagged(rdmap.OpSend, true, 0, rdmap.QNSend, msn, 0, []byte("hi")))
	sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, []byte("yo")))
	for i, want := range []struct {
		id   uint64
		data string
	}{{0, "hi"}, {1, "yo"}} {
		wc := tt.wait(tt.rcq)
		if wc.Status != StatusSuccess || wc.ID != want.id || wc.Bytes != uint32(len(want.data)) {
			t.Fatalf("receive completion %d: %+v, want ID %d success with %d bytes", i, wc, want.id, len(want.data))
		}
		off := int(want.id) * 64
		if got := string(tt.bufs["recv"][off : off+len(want.data)]); got != want.data {
			t.Fatalf("receive %d holds %q, want %q", want.id, got, want.data)
		}
	}
	if st := tt.qp.State(); st != StateRTS {
		t.Fatalf("QP in %s after two well-formed Sends", st)
	}
}
