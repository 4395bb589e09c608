package initiator_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// lateWriteProxy sits between an initiator and a real target. It passes
// every byte through, but on the target-to-initiator stream, right after
// the last FPDU of each RDMA Read Response, it adds an RDMA Write of 0xEE
// bytes into the Read's sink STag (the initiator's slot STag, which the
// Read Request named): what a hostile target can do once its data is
// delivered.
type lateWriteProxy struct {
	l        net.Listener
	target   string
	injected atomic.Int64
	wg       sync.WaitGroup
}

func newLateWriteProxy(t *testing.T, target string) *lateWriteProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lateWriteProxy{l: l, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *lateWriteProxy) serve() {
	defer p.wg.Done()
	for {
		ic, err := p.l.Accept()
		if err != nil {
			return
		}
		tc, err := net.Dial("tcp", p.target)
		if err != nil {
			ic.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(tc, ic); tc.Close() }()
		go func() { defer p.wg.Done(); p.down(tc, ic); ic.Close() }()
	}
}

// down copies the target's stream to the initiator, FPDU by FPDU.
func (p *lateWriteProxy) down(tc, ic net.Conn) {
	var raw bytes.Buffer
	rep, err := mpa.ReadFrame(io.TeeReader(tc, &raw), true)
	if err != nil {
		return
	}
	if _, err := ic.Write(raw.Bytes()); err != nil || rep.Reject {
		return
	}
	rd := mpa.NewReader(tc, mpa.ReaderConfig{CRC: rep.CRC})
	for {
		n, err := rd.Next()
		if err != nil {
			return
		}
		u := make([]byte, n)
		if rd.ReadFull(u) != nil || rd.Finish() != nil {
			return
		}
		out := mpa.AppendFPDU(nil, u, nil, rep.CRC)
		if ddp.IsTagged(u[0]) && len(u) > ddp.TaggedHeaderLen {
			h := ddp.Tagged(u[:ddp.TaggedHeaderLen])
			if rdmap.Opcode(h.RsvdULP()&0x0F) == rdmap.OpReadResponse && h.Last() {
				w := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+512)
				ddp.Tagged(w).Encode(&ddp.TaggedFields{Last: true, RsvdULP: rdmap.Ctrl(rdmap.OpWrite), STag: h.STag(), TO: 0})
				w = append(w, bytes.Repeat([]byte{0xEE}, 512)...)
				out = mpa.AppendFPDU(out, w, nil, rep.CRC)
				p.injected.Add(1)
			}
		}
		if _, err := ic.Write(out); err != nil {
			return
		}
	}
}

// TestReadSinkWritableAfterCompletion: once ReadAt returned, the target
// must no longer be able to reach the caller's memory. A target that
// sends an RDMA Write into the Read's sink STag right after the Read
// Response must be refused (a Terminate), not land in a buffer the caller
// already owns again.
func TestReadSinkWritableAfterCompletion(t *testing.T) {
	e := newEnv(t, envOpts{})
	px := newLateWriteProxy(t, e.addr)
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
		cfg := initiator.Config{Addr: px.l.Addr().String(), Volume: "vol0", Initiator: "victim", Secret: testSecret,
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
	t.Logf("%d reads completed, %d late Writes injected, %d buffers corrupted after completion", reads, px.injected.Load(), corrupted)
	if px.injected.Load() == 0 || reads == 0 {
		t.Fatal("no READ went through READY and RDMA Read to completion: nothing was tested")
	}
}
