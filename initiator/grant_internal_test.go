package initiator

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/rnic/term"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// TestGrantSTagDeadAfterUse: every write grant the target advertised is
// invalidated by the WRITE that consumed it (the initiator's Send with
// Invalidate), so an RDMA Write through a used grant, even on the session's
// own QP, is refused by the target's RNIC with a Terminate before a byte is
// placed.
func TestGrantSTagDeadAfterUse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, secret := startTarget(t, ctx, quiet)

	events := make(chan rnic.AsyncEvent, 16)
	idev, err := rnic.Open(rnic.Config{Name: "initiator", Logger: quiet, AsyncHandler: func(ev rnic.AsyncEvent) {
		select {
		case events <- ev:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer idev.Close()
	c, err := Connect(ctx, Config{Addr: addr, Volume: "v", Initiator: "g", Secret: secret, Logger: quiet,
		Device: idev, QPs: 1, NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := s.qps[0]
	snapshot := func() map[uint32]uint64 {
		q.gmu.Lock()
		defer q.gmu.Unlock()
		m := map[uint32]uint64{}
		for _, g := range q.grants {
			m[g.STag] = g.TO
		}
		return m
	}
	before := snapshot()
	if len(before) == 0 {
		t.Fatal("the WELCOME granted nothing")
	}
	// Each WRITE that fits a grant consumes (and invalidates) one.
	buf := make([]byte, 4096)
	for i := 0; i < 8; i++ {
		if err := c.WriteAt(ctx, buf, int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	after := snapshot()
	var used []struct{ stag, to uint64 }
	for st, to := range before {
		if _, live := after[st]; !live {
			used = append(used, struct{ stag, to uint64 }{uint64(st), to})
		}
	}
	if len(used) == 0 {
		t.Fatal("no grant was consumed by 8 WRITEs")
	}
	old := used[0]
	if _, err := q.QP.PostSend(rnic.SendWR{ID: 999, Op: rnic.WRWrite, SGL: []rnic.SGE{q.AreaSGE(0, 64)},
		Remote: rnic.RemoteAddr{STag: rnic.STag(old.stag), TO: old.to}}); err != nil {
		t.Fatal(err)
	}
	want := term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: term.TaggedInvalidSTag}
	for {
		select {
		case ev := <-events:
			if ev.Type != rnic.EventTerminateReceived {
				continue
			}
			if ev.Terminate == nil || ev.Terminate.Cause != want {
				t.Fatalf("Terminate %+v, want %v", ev.Terminate, want)
			}
			t.Logf("%d grants consumed by WRITEs; a Write through the first one got: %v", len(used), ev.Terminate.Cause)
			return
		case <-ctx.Done():
			t.Fatalf("no Terminate for a Write through a used grant %#x@%#x; QP state %v", old.stag, old.to, q.QP.State())
		}
	}
}

// startTarget serves a 16 MiB memory volume "v" on 127.0.0.1 until the
// test ends, and returns its address and secret.
func startTarget(t *testing.T, ctx context.Context, log *slog.Logger) (string, []byte) {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	if _, err := st.CreateVolume(ctx, "v", 16<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tdev, err := rnic.Open(rnic.Config{Name: "target", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tdev.Close() })
	secret := []byte("internal test secret")
	tg, err := target.New(target.Config{Store: st, Device: tdev, Secret: target.StaticSecret(secret), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tdev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(context.Background(), l)
	t.Cleanup(func() { tg.Shutdown(context.Background()) })
	return l.Addr().String(), secret
}

// TestPutGrantKeepsAtMostCredits: a QP keeps no more write grants than
// its credits, whatever its answers carry (a hostile target could send a
// new grant with every READ's answer); a grant taken for a write and put
// back because it was too small is kept.
func TestPutGrantKeepsAtMostCredits(t *testing.T) {
	q := &conn{credits: 4}
	for i := range 100 {
		q.putGrant(blockproto.GrantFields{STag: uint32(i + 1), Len: 4096})
	}
	if len(q.grants) != 4 {
		t.Fatalf("%d grants kept after 100 answers carried one, want the 4 credits", len(q.grants))
	}
	g, ok := q.takeGrant()
	if !ok {
		t.Fatal("no grant to take")
	}
	q.putGrant(g)
	if len(q.grants) != 4 {
		t.Fatalf("%d grants after one was taken and put back, want 4", len(q.grants))
	}
	q.putGrant(blockproto.GrantFields{}) // STag 0: none
	if len(q.grants) != 4 {
		t.Fatalf("%d grants after an answer without one, want 4", len(q.grants))
	}
}
