package initiator

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// TestWriteResponseBeforePostStaleMark: start publishes a granted WRITE's
// slot as live (state.Store) before PostSendMarked records the new WRs'
// position in sl.mark. A RESPONSE the handler takes in between (a hostile
// target sending the predictable next tag) must not be checked against
// the mark of the slot's previous exchange, whose WRs started long ago:
// writeWRs holds the mark until the post. The window is too small to hit
// through the wire, so the test runs start's statements for a granted
// WRITE, in start's order, up to the post (keep them in step with start),
// and hands the handler's onResponse a forged RESPONSE. (Found by review,
// with this test.)
func TestWriteResponseBeforePostStaleMark(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, secret := startTarget(t, ctx, quiet)
	c, err := Connect(ctx, Config{Addr: addr, Volume: "v", Initiator: "g", Secret: secret, Logger: quiet,
		QPs: 1, NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := s.qps[0]
	// Every slot ends a WRITE: each mark names four WRs, all started.
	buf := make([]byte, 4096)
	for i := 0; i <= len(q.slots); i++ {
		if err := c.WriteAt(ctx, buf, int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	sl, err := q.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := q.takeGrant()
	if !ok {
		t.Fatal("no grant")
	}
	// start, for a WRITE that fits a grant, up to its PostSendMarked.
	sl.op, sl.flags, sl.off, sl.n, sl.p, sl.async = blockproto.OpWrite, 0, 0, 4096, buf, false
	sl.seq++
	sl.status, sl.value, sl.detail, sl.err = 0, 0, "", nil
	sl.posted = false
	sl.stage = stageResponse
	sl.writeWRs(rnic.STag(g.STag), g.TO)
	sl.state.Store(slotMapped)
	// The forged RESPONSE, handled now.
	var b [blockproto.MaxMessage]byte
	m, err := blockproto.EncodeResponse(b[:], &blockproto.ResponseFields{Op: blockproto.OpResponse, Tag: sl.tag(),
		Status: blockproto.StatusOK})
	if err != nil {
		t.Fatal(err)
	}
	r, err := blockproto.ParseResponse(m)
	if err != nil {
		t.Fatal(err)
	}
	err = sl.onResponse(r)
	if err == nil {
		<-sl.done
		sl.state.Store(slotIdle)
		q.free <- sl.idx
		t.Fatal("a RESPONSE to a WRITE whose WRs were not even posted was believed (the slot's mark still names its previous exchange)")
	}
}
