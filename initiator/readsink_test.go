package initiator_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// newLateWriteProxy relays between an initiator and a real target; on the
// target-to-initiator stream, right after the last FPDU of each RDMA Read
// Response, it adds an RDMA Write of 0xEE bytes into the Read's sink STag
// (the initiator's slot STag, which the Read Request named): what a
// hostile target can do once its data is delivered. injected counts them.
func newLateWriteProxy(t *testing.T, target string, injected *atomic.Int64) *fpduProxy {
	return newFPDUProxy(t, target, proxyHooks{down: func(u []byte, crc bool) []byte {
		out := mpa.AppendFPDU(nil, u, nil, crc)
		if ddp.IsTagged(u[0]) && len(u) > ddp.TaggedHeaderLen {
			h := ddp.Tagged(u[:ddp.TaggedHeaderLen])
			if rdmap.Opcode(h.RsvdULP()&0x0F) == rdmap.OpReadResponse && h.Last() {
				w := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+512)
				ddp.Tagged(w).Encode(&ddp.TaggedFields{Last: true, RsvdULP: rdmap.Ctrl(rdmap.OpWrite), STag: h.STag(), TO: 0})
				w = append(w, bytes.Repeat([]byte{0xEE}, 512)...)
				out = mpa.AppendFPDU(out, w, nil, crc)
				injected.Add(1)
			}
		}
		return out
	}})
}

// TestReadSinkWritableAfterCompletion: once ReadAt returned, the target
// must no longer be able to reach the caller's memory. A target that
// sends an RDMA Write into the Read's sink STag right after the Read
// Response must be refused (a Terminate), not land in a buffer the caller
// already owns again.
func TestReadSinkWritableAfterCompletion(t *testing.T) {
	e := newEnv(t, envOpts{})
	var injected atomic.Int64
	px := newLateWriteProxy(t, e.addr, &injected)
	ctx := tctx(t)
	want := bytes.Repeat([]byte{0x11}, 4096)
	{
		c := e.client("seed", nil)
		if err := c.WriteAt(ctx, want, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	corrupted, reads := 0, 0
	for i := 0; i < 20 && corrupted == 0; i++ {
		cfg := initiator.Config{Addr: px.addr(), Volume: "vol0", Initiator: "victim", Secret: testSecret,
			Logger: logger(), QPs: 1, InlineRead: -1, NoReconnect: true}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := initiator.Connect(cctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		err = c.ReadAt(ctx, buf, 0)
		if err == nil {
			reads++
			got := bytes.Equal(buf, want)
			time.Sleep(50 * time.Millisecond) // the caller owns buf again
			if !got || !bytes.Equal(buf, want) {
				corrupted++
				t.Errorf("attempt %d: the target wrote into the caller's buffer after the READ completed "+
					"(data right after ReadAt returned correct: %v; now % x...)", i, got, buf[:8])
			}
		}
		c.Close()
	}
	t.Logf("%d reads completed, %d late Writes injected, %d buffers corrupted after completion", reads, injected.Load(), corrupted)
	if injected.Load() == 0 || reads == 0 {
		t.Fatal("no READ went through READY and RDMA Read to completion: nothing was tested")
	}
}
