package target

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// The tests of this package run a real Target (memory store, its own
// RNIC on loopback) against peers built from the same engine: each peer
// is an endpoint that speaks the block protocol message by message, so a
// test can put a slot in any state, hold a READY buffer past its lease,
// or break the protocol on purpose, and then look at the target's state.

var testSecret = []byte("the target package's test secret")

const volSize = 16 << 20

func testLogger() *slog.Logger {
	if os.Getenv("RNIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// rig is a target serving volume "vol0" of a memory store.
type rig struct {
	t    *testing.T
	st   store.Store
	vol  store.Volume // the store's handle of vol0, for checks
	tgt  *Target
	addr string
	cdev *rnic.Device // the peers' RNIC
	// via, if set, is the address peers dial instead of addr (a proxy);
	// peerORD, if set, the ORD of their QPs (default 4).
	via     string
	peerORD int
}

func newRig(t *testing.T, mod func(*Config)) *rig {
	t.Helper()
	return newRigOn(t, store.NewMemory(), mod)
}

// newRigOn is newRig on store st (closed with the rig).
func newRigOn(t *testing.T, st store.Store, mod func(*Config)) *rig {
	t.Helper()
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "vol0", volSize, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dev, err := rnic.Open(rnic.Config{Name: "target", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: st, Device: dev, Secret: StaticSecret(testSecret), Logger: testLogger()}
	if mod != nil {
		mod(&cfg)
	}
	tg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- tg.Serve(context.Background(), l) }()
	cdev, err := rnic.Open(rnic.Config{Name: "peer", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	vol, err := st.OpenVolume(ctx, "vol0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, vol: vol, tgt: tg, addr: l.Addr().String(), cdev: cdev}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := tg.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve returned %v", err)
		}
		l.Close()
		cdev.Close()
		dev.Close()
		vol.Close()
		st.Close()
	})
	return r
}

// session returns the target's only session (waiting for it to appear).
func (r *rig) session() *session {
	r.t.Helper()
	var s *session
	r.waitFor("a session", func() bool {
		r.tgt.mu.Lock()
		defer r.tgt.mu.Unlock()
		for _, x := range r.tgt.sessions {
			s = x
		}
		return s != nil
	})
	return s
}

// noSession reports whether the target has no session left, torn down
// to the end (its QPs released, its locks and volume reference dropped).
func (r *rig) noSession() bool {
	r.tgt.mu.Lock()
	n := len(r.tgt.sessions)
	r.tgt.mu.Unlock()
	return n == 0 && r.tgt.m.SessionsActive.Load() == 0
}

// waitFor waits (up to 10 s) until cond holds: the wait is bounded by the
// state it waits for, never by a guess of how long something takes.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// peer is an initiator QP built by hand on an endpoint.
type peer struct {
	t    *testing.T
	ep   *endpoint.Endpoint
	sink []byte // RDMA Read sink and RDMA Write source
	mr   *rnic.MR
	w    blockproto.WelcomeFields
	seq  uint32
	held []rnic.WC // receive completions that arrived while await waited
}

const peerSink = 1 << 20

// dial connects a peer and logs it in to vol0 with credits, asking for
// inline reads of up to inline bytes (0: none).
func (r *rig) dial(credits, inline int) *peer { return r.dialVolume(credits, inline, "vol0") }

// dialProof connects a peer and logs it in to volume vol up to its
// PROOF, which it returns with the LOGIN and the CHALLENGE.
func (r *rig) dialProof(credits, inline int, vol string) (p *peer, login, challenge, proof []byte) {
	t := r.t
	t.Helper()
	ord, addr := 4, r.addr
	if r.peerORD > 0 {
		ord = r.peerORD
	}
	if r.via != "" {
		addr = r.via
	}
	ep, err := endpoint.New(endpoint.Config{Device: r.cdev,
		QP:       rnic.QPConfig{SQDepth: 64, IRD: 1, ORD: ord, InboundWrite: true},
		Receives: credits + 2, RecvSize: blockproto.DataLen(max(inline, blockproto.MaxMessage)),
		SendAreas: 4, SendSize: blockproto.MaxMessage})
	if err != nil {
		t.Fatal(err)
	}
	p = &peer{t: t, ep: ep, sink: make([]byte, peerSink)}
	t.Cleanup(func() { ep.Close(nil) })
	if p.mr, err = ep.Register(p.sink, rnic.LocalRead|rnic.LocalWrite|rnic.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.cdev.Connect(ctx, ep.QP, addr, rnic.ConnParams{ORD: ord, IRD: 1, LargeFPDU: true}); err != nil {
		t.Fatal(err)
	}
	nonce, err := blockproto.NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	lm, err := blockproto.EncodeLogin(ep.Area(0), &blockproto.LoginFields{Credits: uint16(credits), Inline: uint32(inline),
		Nonce: nonce, Initiator: "peer", Volume: vol})
	if err != nil {
		t.Fatal(err)
	}
	login = bytes.Clone(lm)
	p.send(login)
	challenge = bytes.Clone(p.recv())
	mac, err := blockproto.InitiatorProof(testSecret, login, challenge)
	if err != nil {
		t.Fatal(err)
	}
	proof = bytes.Clone(blockproto.EncodeProof(ep.Area(1), mac[:]))
	p.send(proof)
	return p, login, challenge, proof
}

// dialVolume is dial to volume vol.
func (r *rig) dialVolume(credits, inline int, vol string) *peer {
	t := r.t
	t.Helper()
	p, login, challenge, proof := r.dialProof(credits, inline, vol)
	w, err := blockproto.ParseWelcome(p.recv())
	if err != nil {
		t.Fatalf("expected WELCOME: %v", err)
	}
	tp, err := blockproto.TargetProof(testSecret, login, challenge, proof, w)
	if err != nil || !blockproto.ProofEqual(tp[:], w.TargetProof()) {
		t.Fatalf("the WELCOME's proof does not verify (%v)", err)
	}
	p.w = w.Fields()
	return p
}

// post posts one work request.
func (p *peer) post(wr rnic.SendWR) {
	p.t.Helper()
	if _, err := p.ep.QP.PostSend(wr); err != nil {
		p.t.Fatal(err)
	}
}

// send sends msg (copied to send area 2) as a Send; sendInv as a Send
// with Invalidate of stag.
func (p *peer) send(msg []byte) { p.sendOp(rnic.WRSend, 0, msg) }

func (p *peer) sendInv(stag uint32, msg []byte) { p.sendOp(rnic.WRSendInv, stag, msg) }

func (p *peer) sendOp(op rnic.WROp, stag uint32, msg []byte) {
	p.t.Helper()
	n := copy(p.ep.Area(2), msg)
	p.post(rnic.SendWR{ID: sendID, Op: op, SGL: []rnic.SGE{p.ep.AreaSGE(2, n)}, InvalidateSTag: rnic.STag(stag)})
	// The area is reused by the next send: wait until this one left.
	if wc := p.await(sendID); wc.Status != rnic.StatusSuccess {
		p.t.Fatalf("send: %v", wc.Err())
	}
}

// Work request IDs of the peer's signaled work requests.
const (
	sendID = 1 << 40
	readID = 2 << 40
)

// next returns the next completion (10 s at most), those await put aside
// first.
func (p *peer) next() rnic.WC {
	p.t.Helper()
	if len(p.held) > 0 {
		wc := p.held[0]
		p.held = p.held[1:]
		return wc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]rnic.WC
	if _, err := p.ep.CQ.Wait(ctx, wc[:]); err != nil {
		p.t.Fatalf("waiting for a completion: %v", err)
	}
	return wc[0]
}

// await returns the completion of the work request id (or the first
// failed one), putting receive completions aside for recv.
func (p *peer) await(id uint64) rnic.WC {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]rnic.WC
	for {
		if _, err := p.ep.CQ.Wait(ctx, wc[:]); err != nil {
			p.t.Fatalf("waiting for completion %#x: %v", id, err)
		}
		if wc[0].Op != rnic.WRRecv && (wc[0].ID == id || wc[0].Status != rnic.StatusSuccess) {
			return wc[0]
		}
		p.held = append(p.held, wc[0])
	}
}

// recv returns the next message the target sent, reposting its receive.
func (p *peer) recv() []byte {
	p.t.Helper()
	wc := p.next()
	if wc.Status != rnic.StatusSuccess || wc.Op != rnic.WRRecv {
		p.t.Fatalf("expected a message, got %+v (%v)", wc, wc.Err())
	}
	msg := bytes.Clone(p.ep.Received(&wc))
	if err := p.ep.Repost(int(wc.ID)); err != nil {
		p.t.Fatal(err)
	}
	return msg
}

// command sends a command on slot (with Invalidate of f.STag if inv) and
// returns its tag.
func (p *peer) command(f blockproto.CommandFields, slot uint16, inv bool) uint32 {
	p.seq++
	f.Tag = p.seq<<16 | uint32(slot)
	var b [blockproto.CommandLen]byte
	blockproto.Command(b[:]).Encode(&f)
	if inv {
		p.sendInv(f.STag, b[:])
	} else {
		p.send(b[:])
	}
	return f.Tag
}

// response reads the RESPONSE to tag.
func (p *peer) response(tag uint32) blockproto.Response {
	p.t.Helper()
	r, err := blockproto.ParseResponse(p.recv())
	if err != nil || r.Tag() != tag {
		p.t.Fatalf("expected the RESPONSE to %#x: %v", tag, err)
	}
	return r
}

// ready sends op (READ or WRITE_REQ) of n bytes at off on slot and returns
// the READY's buffer.
func (p *peer) ready(op blockproto.Opcode, off uint64, n uint32, slot uint16) blockproto.GrantFields {
	p.t.Helper()
	tag := p.command(blockproto.CommandFields{Op: op, Offset: off, Length: n}, slot, false)
	r, err := blockproto.ParseReady(p.recv())
	if err != nil || r.Tag() != tag {
		p.t.Fatalf("expected the READY to %#x: %v", tag, err)
	}
	return r.Buffer().Fields()
}

// rdmaRead reads n bytes of stag at to into the sink and returns the
// completion.
func (p *peer) rdmaRead(stag uint32, to uint64, n int) rnic.WC {
	p.t.Helper()
	p.post(rnic.SendWR{ID: readID, Op: rnic.WRRead, Local: rnic.SGE{STag: p.mr.STag(), Len: uint32(n)},
		Remote: rnic.RemoteAddr{STag: rnic.STag(stag), TO: to}})
	return p.await(readID)
}

// rdmaWrite writes data (copied to the sink first) to stag at to.
func (p *peer) rdmaWrite(stag uint32, to uint64, data []byte) {
	n := copy(p.sink, data)
	p.post(rnic.SendWR{Op: rnic.WRWrite, Unsignaled: true, SGL: []rnic.SGE{{STag: p.mr.STag(), Len: uint32(n)}},
		Remote: rnic.RemoteAddr{STag: rnic.STag(stag), TO: to}})
}

// pattern is n bytes that depend on seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}
