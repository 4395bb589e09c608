package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
)

// fakeTarget accepts one connection on its own RNIC and runs script on
// an endpoint for it: a target that says what the test wants, byte for
// byte.
func fakeTarget(t *testing.T, script func(ep *endpoint.Endpoint, recv func() []byte, send func([]byte))) string {
	t.Helper()
	dev, err := rnic.Open(rnic.Config{Name: "fake-target", Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := endpoint.New(endpoint.Config{Device: dev, QP: rnic.QPConfig{SQDepth: 16, IRD: 4, ORD: 1, InboundRead: true,
		InboundWrite: true, InboundAtomic: true}, Receives: 8, RecvSize: blockproto.MaxMessage, SendAreas: 4,
		SendSize: blockproto.MaxMessage})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		l.Close()
		<-done
		ep.Close(nil)
		dev.Close()
	})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := l.Accept(ctx)
		if err != nil {
			return
		}
		if _, err := req.Accept(ctx, ep.QP, rnic.AcceptParams{LargeFPDU: true}); err != nil {
			t.Errorf("fake target: accept: %v", err)
			return
		}
		area := 0
		send := func(m []byte) {
			n := copy(ep.Area(area), m)
			if _, err := ep.QP.PostSend(rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{ep.AreaSGE(area, n)}}); err != nil {
				t.Errorf("fake target: send: %v", err)
			}
			area = (area + 1) % 4
		}
		recv := func() []byte {
			wc, msg, err := ep.WaitRecv(ctx)
			if err != nil {
				return nil
			}
			msg = bytes.Clone(msg)
			ep.Repost(int(wc.ID))
			return msg
		}
		script(ep, recv, send)
		// Hold the connection until the initiator is done with it.
		ep.QP.WaitState(ctx, rnic.StateError, rnic.StateIdle)
	}()
	return l.Addr().String()
}

// fakeLogin runs the target's side of a login for a fake target:
// CHALLENGE, then a WELCOME of a 1 MiB volume with 4 credits and w's
// Slot, LockSTag and LockCount, with the target's proof. It reports
// false, after t.Error, on a failure.
func fakeLogin(t *testing.T, recv func() []byte, send func([]byte), w blockproto.WelcomeFields) bool {
	login := blockproto.Login(recv())
	nonce, _ := blockproto.NewNonce()
	challenge := bytes.Clone(blockproto.EncodeChallenge(make([]byte, blockproto.MaxMessage), &nonce))
	send(challenge)
	proof := blockproto.Proof(recv())
	f := blockproto.WelcomeFields{SessionID: 7, BootID: 9, VolumeSize: 1 << 20, MaxTransfer: 1 << 20,
		GrantSize: 64 << 10, Credits: 4, MinIO: 512, PreferredIO: 4096,
		Slot: w.Slot, LockSTag: w.LockSTag, LockCount: w.LockCount}
	m, err := blockproto.EncodeWelcome(make([]byte, blockproto.MaxMessage), &f)
	if err != nil {
		t.Error(err)
		return false
	}
	tp, err := blockproto.TargetProof(testSecret, login, challenge, proof, m)
	if err != nil {
		t.Error(err)
		return false
	}
	copy(m.TargetProof(), tp[:])
	send(m)
	return true
}

// TestProtocolErrorsKeepTheirCause: an initiator's protocol errors wrap
// both ErrProtocol and the decoder's error beneath it, at login (a
// malformed CHALLENGE) and after it (a malformed answer ends the session:
// with NoReconnect the requests then fail with both causes).
func TestProtocolErrorsKeepTheirCause(t *testing.T) {
	t.Run("login", func(t *testing.T) {
		addr := fakeTarget(t, func(_ *endpoint.Endpoint, recv func() []byte, send func([]byte)) {
			recv()                                                                           // LOGIN
			send([]byte{blockproto.Version, byte(blockproto.OpChallenge), 0, 0, 0, 0, 0, 0}) // 8 bytes of 48
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "v", Initiator: "i", Secret: testSecret,
			Logger: logger(), QPs: 1, NoReconnect: true})
		var de *blockproto.DecodeError
		if !errors.Is(err, initiator.ErrProtocol) || !errors.As(err, &de) || !errors.Is(err, blockproto.ErrShort) {
			t.Fatalf("Connect: %v; want ErrProtocol and the *blockproto.DecodeError (ErrShort) beneath it", err)
		}
	})
	t.Run("session", func(t *testing.T) {
		addr := fakeTarget(t, func(ep *endpoint.Endpoint, recv func() []byte, send func([]byte)) {
			if !fakeLogin(t, recv, send, blockproto.WelcomeFields{}) {
				return
			}
			cmd := blockproto.Command(recv()) // the READ
			var r [blockproto.ResponseFixedLen]byte
			blockproto.EncodeResponse(r[:], &blockproto.ResponseFields{Op: blockproto.OpResponse, Tag: cmd.Tag(),
				Status: blockproto.StatusIO})
			r[12] = 1 // a reserved byte
			send(r[:])
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "v", Initiator: "i", Secret: testSecret,
			Logger: logger(), QPs: 1, NoReconnect: true, HeartbeatInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		err = c.ReadAt(ctx, make([]byte, 4096), 0)
		var de *blockproto.DecodeError
		if !errors.Is(err, initiator.ErrProtocol) || !errors.As(err, &de) {
			t.Fatalf("ReadAt after a malformed RESPONSE: %v; want ErrProtocol and the *blockproto.DecodeError beneath it", err)
		}
	})
}

// TestLockWaitKeepsBothCauses: Lock giving up on its context reports the
// context's error and the last refusal (ErrLocked, with the holder),
// whether the context ends while it waits or during a try.
func TestLockWaitKeepsBothCauses(t *testing.T) {
	e := newEnv(t, envOpts{})
	a, b := e.client("a", nil), e.client("b", nil)
	ctx := tctx(t)
	l, err := a.TryLock(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	wctx, cancel := context.WithTimeout(ctx, time.Second) // long enough for a first refusal
	defer cancel()
	_, err = b.Lock(wctx, 3)
	var le *initiator.LockedError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, initiator.ErrLocked) || !errors.As(err, &le) || le.Holder != "a" {
		t.Fatalf("Lock held by a: %v; want the deadline and ErrLocked naming a", err)
	}
}

// TestGoodbyeDuringLogin: a target shutting down may say GOODBYE on a QP
// it took into a session before that QP's WELCOME left. The login fails
// with the target's status (shutdown), which a reconnect retries, not
// with a protocol error, which would end the client's reconnecting.
func TestGoodbyeDuringLogin(t *testing.T) {
	addr := fakeTarget(t, func(_ *endpoint.Endpoint, recv func() []byte, send func([]byte)) {
		recv() // LOGIN
		nonce, _ := blockproto.NewNonce()
		send(bytes.Clone(blockproto.EncodeChallenge(make([]byte, blockproto.MaxMessage), &nonce)))
		recv() // PROOF
		var r [blockproto.ResponseFixedLen]byte
		bye, err := blockproto.EncodeResponse(r[:], &blockproto.ResponseFields{Op: blockproto.OpGoodbye,
			Status: blockproto.StatusShutdown, Value: blockproto.GoodbyeSynced})
		if err != nil {
			t.Error(err)
			return
		}
		send(bye)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "v", Initiator: "i", Secret: testSecret,
		Logger: logger(), QPs: 1, NoReconnect: true})
	var le *initiator.LoginError
	if errors.Is(err, initiator.ErrProtocol) || !errors.As(err, &le) || le.Status != blockproto.StatusShutdown {
		t.Fatalf("Connect answered by GOODBYE: %v; want a *LoginError with status shutdown, no ErrProtocol", err)
	}
}
