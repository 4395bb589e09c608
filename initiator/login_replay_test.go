package initiator_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/target"
)

// wantAuthReject reads messages on s until a REJECT and requires
// StatusAuth with the target's "authentication failed" reason; then the
// target must close the connection. skip is how many messages (CHALLENGEs)
// may come first.
func wantAuthReject(t *testing.T, s *rawSess, skip int) {
	t.Helper()
	for i := 0; ; i++ {
		msg, err := s.recvMsg()
		if err != nil {
			t.Fatalf("waiting for the REJECT: %v", err)
		}
		r := asReject(msg)
		if r == nil {
			if i < skip {
				if _, err := blockproto.ParseChallenge(msg); err == nil {
					continue
				}
			}
			t.Fatalf("got %x, want a REJECT", msg)
		}
		if r.Status != blockproto.StatusAuth || r.Detail != "authentication failed" {
			t.Fatalf("REJECT %d (%s) %q, want %d (%s) %q", r.Status, r.Status, r.Detail,
				blockproto.StatusAuth, blockproto.StatusAuth, "authentication failed")
		}
		t.Logf("refused: %v", r)
		break
	}
	if err := s.p.WaitClosed(10 * time.Second); err != nil {
		t.Fatalf("the target kept the connection after its REJECT: %v", err)
	}
}

// TestLoginReplay: a raw client records an honest login (LOGIN, CHALLENGE,
// PROOF, WELCOME) and replays it on new connections, with and without
// waiting for the new CHALLENGE, and builds a proof for the old nonce with
// the right secret. The target's nonce is new on every connection, so none
// verifies: each is refused with REJECT "authentication failed"
// (StatusAuth), the connection closes, no session is created, and the
// honest session keeps working.
func TestLoginReplay(t *testing.T) {
	e := newEnv(t, envOpts{})
	m := e.tgt.Metrics()
	honest, err := rawDial(e.addr, rawpeer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer honest.Close()
	if err := honest.doLogin("recorded", testSecret, 4); err != nil {
		t.Fatalf("honest raw login: %v", err)
	}
	sessions, failures := m.SessionsActive.Load(), m.LoginFailures.Load()
	rec := honest // the recorded exchange

	dial := func(t *testing.T) *rawSess {
		t.Helper()
		s, err := rawDial(e.addr, rawpeer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	t.Run("replay-after-new-challenge", func(t *testing.T) {
		s := dial(t)
		if err := s.send(rec.login); err != nil {
			t.Fatal(err)
		}
		if err := s.recvChallenge(); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(s.challenge, rec.challenge) {
			t.Fatal("the target sent the recorded CHALLENGE (nonce) again")
		}
		if err := s.send(rec.proof); err != nil {
			t.Fatal(err)
		}
		wantAuthReject(t, s, 0)
	})
	t.Run("replay-blind", func(t *testing.T) {
		s := dial(t)
		if err := s.send(rec.login); err != nil {
			t.Fatal(err)
		}
		if err := s.send(rec.proof); err != nil {
			t.Fatal(err)
		}
		wantAuthReject(t, s, 1)
	})
	t.Run("proof-for-old-nonce", func(t *testing.T) {
		// The right secret, a fresh LOGIN, but the proof covers the
		// recorded CHALLENGE: what a client that fixed the target's nonce
		// would send.
		s := dial(t)
		if err := s.sendLogin("recorded", 4); err != nil {
			t.Fatal(err)
		}
		if err := s.recvChallenge(); err != nil {
			t.Fatal(err)
		}
		if err := s.sendProof(proofMAC(testSecret, s.login, rec.challenge)); err != nil {
			t.Fatal(err)
		}
		wantAuthReject(t, s, 0)
	})
	t.Run("replayed-login-new-proof-of-other-login", func(t *testing.T) {
		// The recorded LOGIN (old initiator nonce), proved over the new
		// CHALLENGE but with the PROOF of another LOGIN: still refused.
		s := dial(t)
		if err := s.send(rec.login); err != nil {
			t.Fatal(err)
		}
		if err := s.recvChallenge(); err != nil {
			t.Fatal(err)
		}
		other := bytes.Clone(rec.login)
		other[30] ^= 1 // another initiator nonce
		if err := s.sendProof(proofMAC(testSecret, other, s.challenge)); err != nil {
			t.Fatal(err)
		}
		wantAuthReject(t, s, 0)
	})

	if got := m.LoginFailures.Load() - failures; got != 4 {
		t.Errorf("login failures counted: %d, want 4", got)
	}
	if got := m.SessionsActive.Load(); got != sessions {
		t.Errorf("sessions active: %d, was %d before the replays", got, sessions)
	}
	// The recorded session is untouched.
	data := bytes.Repeat([]byte("replayed? no. "), 4096/14+1)[:4096]
	if err := honest.write(4096, data); err != nil {
		t.Fatal(err)
	}
	back, err := honest.read(4096, 4096)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("the recorded session after the replays: %v", err)
	}
}

// TestLoginNoSecret: a raw client that proves itself with an empty secret
// (an HMAC keyed with nothing) is refused with REJECT "authentication
// failed" (StatusAuth), both for a name that has a secret and for a name
// the target's secret function gives an empty secret; the initiator package
// refuses to log in without a secret before it connects.
func TestLoginNoSecret(t *testing.T) {
	e := newEnv(t, envOpts{tcfg: func(c *target.Config) {
		c.Secret = func(name, vol string) ([]byte, bool) {
			if name == "blank" {
				return []byte{}, true
			}
			return testSecret, true
		}
	}})
	m := e.tgt.Metrics()
	failures := m.LoginFailures.Load()
	for _, name := range []string{"mallory", "blank"} {
		t.Run(name, func(t *testing.T) {
			s, err := rawDial(e.addr, rawpeer.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.sendLogin(name, 4); err != nil {
				t.Fatal(err)
			}
			if err := s.recvChallenge(); err != nil {
				t.Fatal(err)
			}
			if err := s.sendProof(proofMAC(nil, s.login, s.challenge)); err != nil {
				t.Fatal(err)
			}
			wantAuthReject(t, s, 0)
		})
	}
	if got := m.LoginFailures.Load() - failures; got != 2 {
		t.Errorf("login failures counted: %d, want 2", got)
	}
	_, err := e.dial("blank", func(c *initiator.Config) { c.Secret = nil })
	if !errors.Is(err, initiator.ErrAuth) || err.Error() != "initiator: authentication failed: no secret" {
		t.Fatalf("initiator without a secret: %v, want %q", err, "initiator: authentication failed: no secret")
	}
	if m.SessionsActive.Load() != 0 {
		t.Fatalf("%d sessions active after refused logins", m.SessionsActive.Load())
	}
	// An honest initiator still gets in.
	c := e.client("alice", nil)
	if err := c.WriteAt(tctx(t), make([]byte, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
}
