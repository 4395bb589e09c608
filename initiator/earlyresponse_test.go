package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// earlyResponseProxy relays between an initiator and a real target. On the
// target-to-initiator stream it follows every READY with a forged RESPONSE
// (status OK) to the same tag, sent before the initiator can have written
// the data: what a hostile target can do to end a WRITE early. On the
// initiator-to-target stream it keeps a copy of every RDMA Write payload,
// which shows what the initiator's RNIC read from the caller's buffer.
type earlyResponseProxy struct {
	*fpduProxy
	forged atomic.Int64

	mu      sync.Mutex
	written []byte // RDMA Write payloads, in stream order
	upDone  bool   // the initiator-to-target stream ended
}

func newEarlyResponseProxy(t *testing.T, target string) *earlyResponseProxy {
	p := &earlyResponseProxy{}
	p.fpduProxy = newFPDUProxy(t, target, proxyHooks{up: p.up, down: p.down, upEnded: func() {
		p.mu.Lock()
		p.upDone = true
		p.mu.Unlock()
	}})
	return p
}

// up keeps the RDMA Write payloads.
func (p *earlyResponseProxy) up(u []byte, crc bool) []byte {
	if ddp.IsTagged(u[0]) && len(u) > ddp.TaggedHeaderLen {
		h := ddp.Tagged(u[:ddp.TaggedHeaderLen])
		if rdmap.Opcode(h.RsvdULP()&0x0F) == rdmap.OpWrite {
			p.mu.Lock()
			p.written = append(p.written, u[ddp.TaggedHeaderLen:]...)
			p.mu.Unlock()
		}
	}
	return mpa.AppendFPDU(nil, u, nil, crc)
}

// down adds a forged RESPONSE after each READY.
func (p *earlyResponseProxy) down(u []byte, crc bool) []byte {
	out := mpa.AppendFPDU(nil, u, nil, crc)
	if ddp.IsTagged(u[0]) || len(u) <= ddp.UntaggedHeaderLen {
		return out
	}
	h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
	if h.QN() != rdmap.QNSend || h.MO() != 0 || !h.Last() {
		return out
	}
	r, err := blockproto.ParseReady(u[ddp.UntaggedHeaderLen:])
	if err != nil {
		return out
	}
	w := make([]byte, ddp.UntaggedHeaderLen+blockproto.MaxMessage)
	m, err := blockproto.EncodeResponse(w[ddp.UntaggedHeaderLen:], &blockproto.ResponseFields{
		Op: blockproto.OpResponse, Tag: r.Tag(), Status: blockproto.StatusOK})
	if err != nil {
		panic(err)
	}
	w = w[:ddp.UntaggedHeaderLen+len(m)]
	ddp.Untagged(w).Encode(&ddp.UntaggedFields{Last: true, RsvdULP0: rdmap.Ctrl(rdmap.OpSend),
		QN: rdmap.QNSend, MSN: h.MSN() + 1})
	p.forged.Add(1)
	return mpa.AppendFPDU(out, w, nil, crc)
}

// settled waits until n Write payload bytes went through, or the stream
// ended, or a few seconds passed; it returns what went through.
func (p *earlyResponseProxy) settled(n int) []byte {
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		got, done := len(p.written), p.upDone
		if got >= n || done || time.Now().After(deadline) {
			b := bytes.Clone(p.written)
			p.written, p.upDone = nil, false
			p.mu.Unlock()
			return b
		}
		p.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriteSourceReadAfterCompletion: once WriteAt returned, the RNIC
// must no longer read the caller's buffer. A hostile target answers a
// WRITE_REQ with READY and, at once, with a RESPONSE: the initiator must
// not take that RESPONSE before its transmitter has read all of the data
// (it is a protocol error: the target cannot have received the WRITE).
// If WriteAt succeeds, the caller at once overwrites the buffer, and the
// data that leaves for the target must hold none of the new bytes.
func TestWriteSourceReadAfterCompletion(t *testing.T) {
	e := newEnv(t, envOpts{})
	px := newEarlyResponseProxy(t, e.addr)
	ctx := tctx(t)
	const size = 1 << 20
	refused, leaked := 0, 0
	for i := range 30 {
		cfg := initiator.Config{Addr: px.addr(), Volume: "vol0", Initiator: "victim", Secret: testSecret,
			Logger: logger(), QPs: 1, NoReconnect: true}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := initiator.Connect(cctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		buf := bytes.Repeat([]byte{0x11}, size)
		err = c.WriteAt(ctx, buf, 0, false)
		if err == nil {
			// The caller owns buf again.
			for j := range buf {
				buf[j] = 0xEE
			}
		} else if !errors.Is(err, initiator.ErrProtocol) {
			t.Fatalf("attempt %d: WriteAt with a forged early RESPONSE: %v, want a protocol error", i, err)
		} else {
			refused++
		}
		sent := px.settled(size)
		if k := bytes.IndexByte(sent, 0xEE); k >= 0 {
			leaked++
			t.Errorf("attempt %d: the RNIC read the caller's buffer after WriteAt returned (new bytes at %d of %d sent)", i, k, len(sent))
		}
		c.Close()
	}
	t.Logf("%d forged RESPONSEs, %d WRITEs refused, %d leaked the caller's later bytes", px.forged.Load(), refused, leaked)
	if px.forged.Load() == 0 {
		t.Fatal("no WRITE went through READY: nothing was tested")
	}
}
