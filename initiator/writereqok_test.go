package initiator_test

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// TestWriteReqAnsweredOK: a WRITE_REQ ends with READY then the WRITE's
// RESPONSE, or with a RESPONSE carrying an error; a RESPONSE with status
// OK in place of its READY says a write succeeded whose data never left
// the caller's buffer. A proxy in front of a real target replaces each
// READY (only WRITE_REQs get one here: every write is larger than a
// grant) with such a RESPONSE: WriteAt must fail with a protocol error,
// not report the write done while the volume keeps its old bytes.
func TestWriteReqAnsweredOK(t *testing.T) {
	e := newEnv(t, envOpts{})
	var forged atomic.Int64
	px := newFPDUProxy(t, e.addr, proxyHooks{down: func(u []byte, crc bool) []byte {
		if ddp.IsTagged(u[0]) || len(u) <= ddp.UntaggedHeaderLen {
			return mpa.AppendFPDU(nil, u, nil, crc)
		}
		h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
		if h.QN() != rdmap.QNSend || h.MO() != 0 || !h.Last() {
			return mpa.AppendFPDU(nil, u, nil, crc)
		}
		r, err := blockproto.ParseReady(u[ddp.UntaggedHeaderLen:])
		if err != nil {
			return mpa.AppendFPDU(nil, u, nil, crc)
		}
		// The RESPONSE takes the READY's place in the stream (same MSN).
		w := make([]byte, ddp.UntaggedHeaderLen+blockproto.MaxMessage)
		m, err := blockproto.EncodeResponse(w[ddp.UntaggedHeaderLen:], &blockproto.ResponseFields{
			Op: blockproto.OpResponse, Tag: r.Tag(), Status: blockproto.StatusOK})
		if err != nil {
			panic(err)
		}
		w = w[:ddp.UntaggedHeaderLen+len(m)]
		copy(w, u[:ddp.UntaggedHeaderLen])
		forged.Add(1)
		return mpa.AppendFPDU(nil, w, nil, crc)
	}})
	ctx := tctx(t)
	victim := e.client("victim", func(c *initiator.Config) {
		c.Addr, c.QPs, c.NoReconnect = px.addr(), 1, true
	})
	const size = 1 << 20
	buf := bytes.Repeat([]byte{0x5A}, size)
	err := victim.WriteAt(ctx, buf, 0, false)
	if forged.Load() == 0 {
		t.Fatal("no WRITE_REQ was answered with READY: nothing was tested")
	}
	honest := e.client("honest", func(c *initiator.Config) { c.QPs = 1 })
	got := make([]byte, size)
	if rerr := honest.ReadAt(ctx, got, 0); rerr != nil {
		t.Fatal(rerr)
	}
	landed := bytes.Equal(got, buf)
	t.Logf("WriteAt: %v; data on the volume: %v", err, landed)
	switch {
	case err == nil && !landed:
		t.Fatal("WriteAt succeeded on a RESPONSE OK to its WRITE_REQ, but none of its data reached the volume")
	case err != nil && !errors.Is(err, initiator.ErrProtocol):
		t.Fatalf("WriteAt with a RESPONSE OK to its WRITE_REQ: %v, want a protocol error", err)
	}
}
