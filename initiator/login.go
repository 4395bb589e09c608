package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// LoginError is a login the target refused (REJECT), or whose WELCOME did
// not prove the target knows the secret.
type LoginError struct {
	Status blockproto.Status
	Detail string
}

func (e *LoginError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("initiator: login refused: %s: %s", e.Status, e.Detail)
	}
	return fmt.Sprintf("initiator: login refused: %s", e.Status)
}

// Unwrap maps authentication failures to ErrAuth.
func (e *LoginError) Unwrap() error {
	if e.Status == blockproto.StatusAuth {
		return ErrAuth
	}
	return nil
}

// permanent reports whether retrying a login cannot help.
func permanent(err error) bool {
	var le *LoginError
	if errors.As(err, &le) {
		switch le.Status {
		case blockproto.StatusAuth, blockproto.StatusVersion, blockproto.StatusNoVolume, blockproto.StatusProtocol:
			return true
		}
	}
	return errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol)
}

// login connects the QP and runs LOGIN/CHALLENGE/PROOF/WELCOME; join adds
// it to the session whose ID the first QP's WELCOME gave.
func (q *conn) login(ctx context.Context, join bool) error {
	s, c := q.s, q.s.c
	if _, err := c.dev.Connect(ctx, q.QP, s.addr, rnic.ConnParams{ORD: c.cfg.ORD, IRD: 1, LargeFPDU: true}); err != nil {
		return fmt.Errorf("initiator: connect %s: %w", s.addr, err)
	}
	nonce, err := blockproto.NewNonce()
	if err != nil {
		return err
	}
	f := blockproto.LoginFields{Credits: uint16(q.credits), Inline: uint32(q.askInline), Extents: q.askExtents,
		NoHole: q.askNoHole, Nonce: nonce, Initiator: c.cfg.Initiator, Volume: c.cfg.Volume}
	if join {
		f.Join, f.SessionID = true, s.id
	}
	area := q.Areas(q.loginArea, loginAreas)
	lm, err := blockproto.EncodeLogin(area, &f)
	if err != nil {
		return err
	}
	login := append(blockproto.Login(nil), lm...)
	if err := q.sendLogin(len(lm)); err != nil {
		return err
	}
	msg, err := q.waitLoginMsg(ctx)
	if err != nil {
		return err
	}
	chm, err := blockproto.ParseChallenge(msg)
	if err != nil {
		return fmt.Errorf("%w: expected CHALLENGE: %w", ErrProtocol, err)
	}
	challenge := append(blockproto.Challenge(nil), chm...)
	mac, err := blockproto.InitiatorProof(c.cfg.Secret, login, challenge)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrAuth, err)
	}
	pm := blockproto.EncodeProof(area, mac[:])
	proof := append(blockproto.Proof(nil), pm...)
	if err := q.sendLogin(len(pm)); err != nil {
		return err
	}
	msg, err = q.waitLoginMsg(ctx)
	if err != nil {
		return err
	}
	w, err := blockproto.ParseWelcome(msg)
	if err != nil {
		return fmt.Errorf("%w: expected WELCOME: %w", ErrProtocol, err)
	}
	tp, err := blockproto.TargetProof(c.cfg.Secret, login, challenge, proof, w)
	if err != nil || !blockproto.ProofEqual(tp[:], w.TargetProof()) {
		return &LoginError{Status: blockproto.StatusAuth, Detail: "the target could not prove it knows the secret"}
	}
	wf := w.Fields()
	if join {
		if wf.SessionID != s.id || wf.BootID != s.bootID {
			return fmt.Errorf("%w: join answered for session %#x boot %#x", ErrProtocol, wf.SessionID, wf.BootID)
		}
	} else {
		if wf.MinIO > 4096 || wf.MaxTransfer < 4096 {
			return fmt.Errorf("%w: unusable geometry: min I/O %d, max transfer %d", ErrProtocol, wf.MinIO, wf.MaxTransfer)
		}
		s.id, s.bootID, s.size, s.slot = wf.SessionID, wf.BootID, int64(wf.VolumeSize), wf.Slot
		s.maxTransfer, s.grantSize = int(wf.MaxTransfer), int(wf.GrantSize)
		s.readOnly = wf.VolumeFlags&blockproto.VolumeReadOnly != 0
		s.lockSTag, s.lockTO, s.lockCount = rnic.STag(wf.LockSTag), wf.LockTO, wf.LockCount
	}
	if int(wf.Credits) > q.credits {
		return fmt.Errorf("%w: %d credits granted, %d asked", ErrProtocol, wf.Credits, q.credits)
	}
	if int(wf.Inline) > q.askInline {
		return fmt.Errorf("%w: inline reads of %d bytes granted, %d asked", ErrProtocol, wf.Inline, q.askInline)
	}
	q.inline = wf.Inline
	if wf.Extents && !q.askExtents {
		return fmt.Errorf("%w: BLOCK_STATUS granted, not asked", ErrProtocol)
	}
	q.extents = wf.Extents
	if wf.NoHole && !q.askNoHole {
		return fmt.Errorf("%w: WRITE_ZEROES with FlagNoHole granted, not asked", ErrProtocol)
	}
	q.noHole = wf.NoHole
	if err := q.setCredits(int(wf.Credits)); err != nil {
		return err
	}
	q.grants = append(q.grants[:0], wf.Grants...)
	// The target registers the lock table once per QP, in that QP's
	// protection domain: an atomic must name the STag of the QP it uses.
	q.lockSTag = rnic.STag(wf.LockSTag)
	return nil
}

// sendLogin sends n bytes of the login area, unsignaled: the area is
// next written after the target answered, when the Send is long gone.
func (q *conn) sendLogin(n int) error {
	wr := rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{q.AreaSGE(q.loginArea, n)}}
	if _, err := q.QP.PostSend(wr); err != nil {
		return fmt.Errorf("initiator: login: %w", err)
	}
	return nil
}

// waitLoginMsg waits for the next message, reposting its receive; a
// REJECT becomes a *LoginError.
func (q *conn) waitLoginMsg(ctx context.Context) ([]byte, error) {
	var w [1]rnic.WC
	if _, err := q.CQ.Wait(ctx, w[:]); err != nil {
		return nil, fmt.Errorf("initiator: login: %w", err)
	}
	wc := &w[0]
	if wc.Status != rnic.StatusSuccess {
		return nil, fmt.Errorf("initiator: login: %w (the target closed the connection)", wc.Err())
	}
	if wc.Op != rnic.WRRecv {
		return nil, fmt.Errorf("%w: unexpected completion %v during login", ErrProtocol, wc.Op)
	}
	msg := append([]byte(nil), q.Received(wc)...)
	// A REJECT or a GOODBYE first: the target closes right after either,
	// so reposting the receive may already fail, and the refusal is the
	// error that matters. A GOODBYE comes from a target shutting down, on
	// a QP its session had taken in (after PROOF) before its WELCOME left:
	// no protocol error, but a login failed with the target's status
	// (shutdown), which a reconnect retries as it retries a refused
	// connection while the target restarts.
	if _, op, ok := blockproto.PeekOpcode(msg); ok && (op == blockproto.OpReject || op == blockproto.OpGoodbye) {
		r, err := blockproto.ParseResponse(msg)
		if err != nil {
			return nil, fmt.Errorf("%w: bad %s: %w", ErrProtocol, op, err)
		}
		return nil, &LoginError{Status: r.Status(), Detail: string(r.Detail())}
	}
	if err := q.Repost(int(wc.ID)); err != nil {
		return nil, err
	}
	return msg, nil
}
