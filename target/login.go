package target

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// loginError is a refused login: the REJECT's status and reason.
type loginError struct {
	status blockproto.Status
	value  uint64
	detail string
	err    error // for the log
}

func (e *loginError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%s: %s: %v", e.status, e.detail, e.err)
	}
	return fmt.Sprintf("%s: %s", e.status, e.detail)
}

// Unwrap returns the cause, if any: errors.Is and As see through a
// refusal to it (a store error, a canceled context).
func (e *loginError) Unwrap() error { return e.err }

func refuse(st blockproto.Status, detail string, err error) error {
	return &loginError{status: st, detail: detail, err: err}
}

// handle serves one connection request: accept, login, then hand the QP to
// its session.
func (t *Target) handle(req *rnic.ConnRequest) {
	select {
	case t.logins <- struct{}{}:
	default:
		t.log.Warn("too many logins in progress: rejecting a connection", "peer", req.RemoteAddr)
		req.Reject(nil)
		t.m.LoginFailures.Add(1)
		return
	}
	c, err := t.newConn()
	if err != nil {
		<-t.logins
		t.log.Error("allocating a QP", "err", err)
		req.Reject(nil)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		<-t.logins
		req.Reject(nil)
		c.down()
		return
	}
	t.pending[c] = struct{}{}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.Context(), t.cfg.LoginTimeout)
	err = t.accept(ctx, req, c)
	cancel()
	t.mu.Lock()
	delete(t.pending, c)
	t.mu.Unlock()
	<-t.logins
	if err != nil {
		t.m.LoginFailures.Add(1)
		t.log.Info("login refused", "peer", req.RemoteAddr, "err", err)
		var le *loginError
		if errors.As(err, &le) && c.QP.State() == rnic.StateRTS {
			c.reject(le)
		}
		c.down()
		return
	}
	c.sess.startQP(c)
}

// accept runs the MPA exchange and the login on c.
func (t *Target) accept(ctx context.Context, req *rnic.ConnRequest, c *conn) error {
	if _, err := req.Accept(ctx, c.QP, rnic.AcceptParams{IRD: t.cfg.IRD, ORD: 1, LargeFPDU: true}); err != nil {
		return fmt.Errorf("target: accept: %w", err)
	}
	msg, err := c.waitLoginMsg(ctx)
	if err != nil {
		return err
	}
	if v, op, ok := blockproto.PeekOpcode(msg); ok && op == blockproto.OpLogin && v != blockproto.Version {
		return &loginError{status: blockproto.StatusVersion, value: blockproto.Version,
			detail: fmt.Sprintf("protocol version %d is not supported; this target speaks %d", v, blockproto.Version)}
	}
	lm, err := blockproto.ParseLogin(msg)
	if err == nil && t.cfg.LegacyLogin && lm.Inline() != 0 {
		err = fmt.Errorf("LOGIN with unknown flags 0x%04x", blockproto.FlagInline)
	}
	if err == nil && t.cfg.LegacyNoHole && lm.NoHole() {
		err = fmt.Errorf("LOGIN with unknown flags 0x%04x", blockproto.FlagNoHole)
	}
	if err != nil {
		return refuse(blockproto.StatusProtocol, "malformed LOGIN", err)
	}
	login := append(blockproto.Login(nil), lm...)
	name, volName := string(login.Initiator()), string(login.Volume())
	secret, known := t.cfg.Secret(name, volName)
	if !known || len(secret) == 0 {
		// Go through the challenge anyway, so a prober cannot tell unknown
		// names from wrong secrets.
		secret = make([]byte, 32)
		rand.Read(secret)
		known = false
	}
	nonce, err := blockproto.NewNonce()
	if err != nil {
		return err
	}
	ch := blockproto.EncodeChallenge(c.Area(c.loginArea()), &nonce)
	challenge := append(blockproto.Challenge(nil), ch...)
	if err := c.sendLogin(len(ch)); err != nil {
		return err
	}
	msg, err = c.waitLoginMsg(ctx)
	if err != nil {
		return err
	}
	pm, err := blockproto.ParseProof(msg)
	if err != nil {
		return refuse(blockproto.StatusProtocol, "expected PROOF", err)
	}
	proof := append(blockproto.Proof(nil), pm...)
	want, err := blockproto.InitiatorProof(secret, login, challenge)
	if err != nil || !blockproto.ProofEqual(want[:], proof.MAC()) || !known {
		return refuse(blockproto.StatusAuth, "authentication failed", fmt.Errorf("initiator %q volume %q", name, volName))
	}
	sess, err := t.attach(ctx, c, login)
	if err != nil {
		return err
	}
	if err := t.welcome(c, secret, login, challenge, proof); err != nil {
		sess.end("login failed after authentication")
		return err
	}
	t.log.Info("QP logged in", "initiator", name, "volume", volName, "session", sess.id, "slot", sess.slot,
		"qp", c.QP.ID(), "credits", c.credits, "grants", c.grants.count(), "inline", c.inline, "join", login.Join())
	return nil
}

// attach creates the session of a new login, or finds the session a join
// names, and adds c to it.
func (t *Target) attach(ctx context.Context, c *conn, login blockproto.Login) (*session, error) {
	name, volName := string(login.Initiator()), string(login.Volume())
	c.credits = min(int(login.Credits()), t.cfg.MaxCredits)
	if login.Join() {
		t.mu.Lock()
		s := t.sessions[login.SessionID()]
		t.mu.Unlock()
		// A session still in the table may be ending (it leaves the
		// table once torn down): it is no live session to join.
		if s == nil || s.name != name || s.vol.name != volName || s.isEnded() {
			return nil, refuse(blockproto.StatusNoSession, "no such session", fmt.Errorf("join %#x", login.SessionID()))
		}
		if err := c.setupSession(s); err != nil {
			return nil, err
		}
		if !s.addQP(c) {
			return nil, refuse(blockproto.StatusBusy, "session ended or has its maximum of QPs", nil)
		}
		return s, nil
	}
	t.mu.Lock()
	full := len(t.sessions) >= t.cfg.MaxSessions
	t.mu.Unlock()
	if full {
		return nil, refuse(blockproto.StatusBusy, "too many sessions", nil)
	}
	vol, err := t.openVolume(ctx, volName)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, refuse(blockproto.StatusNoVolume, "no volume "+volName, err)
		}
		if errors.Is(err, store.ErrInvalid) {
			return nil, refuse(blockproto.StatusInvalid, "bad volume name "+volName+" (want NAME or NAME@SNAP)", err)
		}
		return nil, refuse(blockproto.StatusIO, "cannot open volume "+volName, err)
	}
	s := &session{t: t, name: name, vol: vol}
	if !vol.takeSlot(s) {
		t.releaseVolume(vol)
		return nil, refuse(blockproto.StatusBusy, fmt.Sprintf("volume %s has %d sessions", volName, blockproto.MaxSlot+1), nil)
	}
	if !t.addSession(s) {
		vol.releaseSlot(s.slot)
		t.releaseVolume(vol)
		return nil, refuse(blockproto.StatusShutdown, "target shutting down", nil)
	}
	if err := c.setupSession(s); err != nil {
		s.end("login failed")
		return nil, err
	}
	if !s.addQP(c) {
		s.end("login failed")
		return nil, refuse(blockproto.StatusBusy, "session ended", nil)
	}
	return s, nil
}

// setupSession allocates c's slots and grants and registers the lock
// table for it.
func (c *conn) setupSession(s *session) error {
	t := c.t
	c.sess = s
	if err := c.setupSlots(c.credits); err != nil {
		return refuse(blockproto.StatusBusy, "out of STags", err)
	}
	if err := c.grants.setup(c, min(c.credits, t.cfg.MaxGrants), t.cfg.GrantSize); err != nil {
		return refuse(blockproto.StatusBusy, "out of STags", err)
	}
	mr, err := c.RegisterMR(rnic.Bytes(s.vol.mem), rnic.MROptions{
		Access: rnic.LocalRead | rnic.LocalWrite | rnic.RemoteAtomic, ZeroBased: true})
	if err != nil {
		return refuse(blockproto.StatusBusy, "cannot register the lock table", err)
	}
	c.lockMR = mr
	return nil
}

// welcome posts the session's receives and sends WELCOME with the first
// grants and the target's proof.
func (t *Target) welcome(c *conn, secret []byte, login blockproto.Login,
	challenge blockproto.Challenge, proof blockproto.Proof) error {
	s := c.sess
	// Receives 0 and 1 carried LOGIN and PROOF; the session needs 2C.
	if err := c.PostReceives(0, 2*c.credits); err != nil {
		return err
	}
	size := s.vol.v.Info().Size
	s.vol.size.Store(size)
	f := blockproto.WelcomeFields{SessionID: s.id, BootID: s.vol.bootID, VolumeSize: uint64(size),
		VolumeID: s.vol.info.ID, MaxTransfer: uint32(t.cfg.MaxTransfer), GrantSize: uint32(t.cfg.GrantSize),
		Credits: uint16(c.credits), Slot: s.slot, LockSTag: uint32(c.lockMR.STag()),
		LockCount: uint32(len(s.vol.words) - blockproto.FirstLockWord), MinIO: minIO, PreferredIO: blk}
	if s.vol.readOnly {
		f.VolumeFlags |= blockproto.VolumeReadOnly
	}
	if n := min(int(login.Inline()), t.cfg.MaxInline) / minIO * minIO; n > 0 {
		if err := c.setupInline(n); err != nil {
			return refuse(blockproto.StatusBusy, "cannot register inline buffers", err)
		}
		f.Inline = uint32(n)
	}
	if login.Extents() {
		c.extents, f.Extents = true, true
	}
	if login.NoHole() {
		c.noHole, f.NoHole = true, true
	}
	var wrs []rnic.SendWR
	var frs [blockproto.MaxWelcomeGrants]rnic.FastReg
	for len(f.Grants) < blockproto.MaxWelcomeGrants {
		g := c.grants.next()
		if g == nil {
			break
		}
		st := g.mr.STag()
		st = st.WithKey(freshKey(t.dev, st))
		i := len(f.Grants)
		frs[i] = rnic.FastReg{STag: st, Mem: rnic.Memory{Pages: g.pages[:], Len: uint64(len(g.buf))}, ZeroBased: true,
			Access: rnic.LocalWrite | rnic.RemoteWrite}
		wrs = append(wrs, rnic.SendWR{Op: rnic.WRFastReg, Unsignaled: true, FastReg: &frs[i]})
		c.grants.advertise(g, st)
		t.m.GrantsIssued.Add(1)
		f.Grants = append(f.Grants, blockproto.GrantFields{STag: uint32(st), Len: uint32(len(g.buf))})
	}
	area := c.Area(c.loginArea())
	w, err := blockproto.EncodeWelcome(area, &f)
	if err != nil {
		return err
	}
	tp, err := blockproto.TargetProof(secret, login, challenge, proof, w)
	if err != nil {
		return err
	}
	copy(w.TargetProof(), tp[:])
	// Unsignaled: the initiator may answer at once, and from here on the
	// completion loop owns the CQ. The login area is not used again.
	wrs = append(wrs, rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{c.AreaSGE(c.loginArea(), len(w))}})
	if _, err := c.QP.PostSend(wrs...); err != nil {
		return fmt.Errorf("target: sending WELCOME: %w", err)
	}
	return nil
}

// waitLoginMsg waits for the next message during login.
func (c *conn) waitLoginMsg(ctx context.Context) ([]byte, error) {
	_, msg, err := c.WaitRecv(ctx)
	if err != nil {
		return nil, fmt.Errorf("target: waiting for a login message: %w", err)
	}
	return msg, nil
}

// sendLogin sends the first n bytes of the login area, unsignaled: the
// area is next written (WELCOME) after the initiator answered, which it
// can only do once this Send arrived. A REJECT, which may answer a PROOF
// sent before that, goes in rejectArea.
func (c *conn) sendLogin(n int) error {
	_, err := c.QP.PostSend(rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{c.AreaSGE(c.loginArea(), n)}})
	if err != nil {
		return fmt.Errorf("target: login send: %w", err)
	}
	return nil
}

// reject sends REJECT and closes the connection.
func (c *conn) reject(le *loginError) {
	m, err := blockproto.EncodeResponse(c.Area(c.rejectArea()), &blockproto.ResponseFields{Op: blockproto.OpReject,
		Status: le.status, Value: le.value, Detail: le.detail})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.t.cfg.LoginTimeout)
	defer cancel()
	if _, err := c.QP.PostSend(rnic.SendWR{ID: wrLogin, Op: rnic.WRSend, SGL: []rnic.SGE{c.AreaSGE(c.rejectArea(), len(m))}}); err != nil {
		return
	}
	// Wait for the REJECT to leave before closing; ignore anything the
	// initiator still sends.
	var wc [1]rnic.WC
	for {
		if _, err := c.CQ.Wait(ctx, wc[:]); err != nil || wc[0].Status != rnic.StatusSuccess || wc[0].ID == wrLogin && wc[0].Op != rnic.WRRecv {
			break
		}
	}
	if c.QP.State() == rnic.StateRTS {
		c.QP.Modify(rnic.StateClosing, rnic.ModifyAttrs{})
	}
}
