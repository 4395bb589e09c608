package initiator_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// rawSess is a block-protocol client made of hand-built RDMA messages on a
// rawpeer connection: it logs in (or records and replays a login) and runs
// commands, so tests can hold real STags of a session (write grants, READY
// buffers, the lock table) and misuse them byte by byte. It runs one
// exchange per slot at a time and expects nothing unsolicited.
type rawSess struct {
	p       *rawpeer.Peer
	timeout time.Duration

	// The login exchange as sent and received.
	login     blockproto.Login
	challenge blockproto.Challenge
	proof     blockproto.Proof
	welcome   blockproto.Welcome

	grants []blockproto.GrantFields // outstanding write grants
	seq    uint32
	reqID  uint32
	msg    []byte // Send being reassembled
}

// rawSinkSTag is the sink STag raw sessions name in their Read Requests:
// they have no memory of their own, the Read Responses are just read.
const rawSinkSTag = 0x5151_0001

func rawDial(addr string, o rawpeer.Options) (*rawSess, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := rawpeer.Dial(ctx, addr, o)
	if err != nil {
		return nil, err
	}
	return &rawSess{p: p, timeout: 10 * time.Second}, nil
}

func (s *rawSess) Close() { s.p.Close() }

// rawReject is a REJECT received instead of a CHALLENGE or WELCOME.
type rawReject struct {
	Status blockproto.Status
	Detail string
}

func (e *rawReject) Error() string { return fmt.Sprintf("REJECT %s: %s", e.Status, e.Detail) }

// rawTerminated is a Terminate received where a message was expected.
type rawTerminated struct{ f rdmap.TerminateFields }

func (e *rawTerminated) Error() string { return "Terminate received: " + e.f.Cause.String() }

// rawEvent is one inbound message or segment.
type rawEvent struct {
	msg      []byte // a whole Send's payload (QN 0)
	readResp bool   // a Read Response segment
	stag     uint32
	to       uint64
	last     bool
	data     []byte
	atomic   bool // an Atomic Response
	reqID    uint32
	orig     uint64
}

// next reads the next message, Read Response segment or Atomic Response;
// a Terminate is a *rawTerminated error.
func (s *rawSess) next() (rawEvent, error) {
	for {
		u, err := s.p.ReadULPDU(s.timeout)
		if err != nil {
			return rawEvent{}, err
		}
		if ddp.IsTagged(u[0]) {
			h := ddp.Tagged(u[:ddp.TaggedHeaderLen])
			if op := rdmap.Opcode(h.RsvdULP() & 0x0F); op != rdmap.OpReadResponse {
				return rawEvent{}, fmt.Errorf("raw session: tagged %v from the target", op)
			}
			return rawEvent{readResp: true, stag: h.STag(), to: h.TO(), last: h.Last(), data: u[ddp.TaggedHeaderLen:]}, nil
		}
		if len(u) < ddp.UntaggedHeaderLen {
			return rawEvent{}, fmt.Errorf("raw session: untagged segment of %d bytes", len(u))
		}
		h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
		body := u[ddp.UntaggedHeaderLen:]
		switch h.QN() {
		case rdmap.QNSend:
			if int(h.MO()) != len(s.msg) {
				return rawEvent{}, fmt.Errorf("raw session: Send segment at MO %d, have %d bytes", h.MO(), len(s.msg))
			}
			s.msg = append(s.msg, body...)
			if !h.Last() {
				continue
			}
			m := s.msg
			s.msg = nil
			return rawEvent{msg: m}, nil
		case rdmap.QNTerminate:
			f, err := rdmap.ParseTerminate(body)
			if err != nil {
				return rawEvent{}, fmt.Errorf("raw session: bad Terminate: %w", err)
			}
			return rawEvent{}, &rawTerminated{f}
		case rdmap.QNAtomicResponse:
			a, err := rdmap.ParseAtomicResponse(body)
			if err != nil {
				return rawEvent{}, err
			}
			return rawEvent{atomic: true, reqID: a.ReqID(), orig: a.Original()}, nil
		default:
			return rawEvent{}, fmt.Errorf("raw session: untagged segment on QN %d", h.QN())
		}
	}
}

// recvMsg returns the next Send's payload.
func (s *rawSess) recvMsg() ([]byte, error) {
	ev, err := s.next()
	if err != nil {
		return nil, err
	}
	if ev.msg == nil {
		return nil, fmt.Errorf("raw session: %+v where a message was expected", ev)
	}
	return ev.msg, nil
}

func (s *rawSess) send(payload []byte) error {
	return s.p.Send(s.p.SendMsg(rdmap.OpSend, 0, bytes.Clone(payload)))
}

func (s *rawSess) sendInv(stag uint32, payload []byte) error {
	return s.p.Send(s.p.SendMsg(rdmap.OpSendInv, stag, bytes.Clone(payload)))
}

// proofMAC computes the initiator proof as blockproto's documentation
// defines it, here independently and for any secret, the empty one
// included (blockproto.InitiatorProof refuses that).
func proofMAC(secret []byte, login, challenge []byte) []byte {
	h := hmac.New(sha256.New, secret)
	field := func(b []byte) {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(b)))
		h.Write(l[:])
		h.Write(b)
	}
	field([]byte("rnic-block v1 initiator proof"))
	field(login)
	field(challenge)
	return h.Sum(nil)
}

// asReject returns the REJECT msg is, or nil.
func asReject(msg []byte) *rawReject {
	if _, op, ok := blockproto.PeekOpcode(msg); !ok || op != blockproto.OpReject {
		return nil
	}
	r, err := blockproto.ParseResponse(msg)
	if err != nil {
		return &rawReject{Status: 0xFFFF, Detail: "malformed REJECT: " + err.Error()}
	}
	return &rawReject{Status: r.Status(), Detail: string(r.Detail())}
}

// sendLogin sends a LOGIN for a new session and records it.
func (s *rawSess) sendLogin(name string, credits uint16) error {
	nonce, err := blockproto.NewNonce()
	if err != nil {
		return err
	}
	m, err := blockproto.EncodeLogin(make([]byte, blockproto.MaxMessage), &blockproto.LoginFields{Credits: credits,
		Nonce: nonce, Initiator: name, Volume: "vol0"})
	if err != nil {
		return err
	}
	s.login = bytes.Clone(m)
	return s.send(m)
}

// recvChallenge reads the CHALLENGE (or a REJECT, as an error) and records it.
func (s *rawSess) recvChallenge() error {
	msg, err := s.recvMsg()
	if err != nil {
		return err
	}
	if r := asReject(msg); r != nil {
		return r
	}
	ch, err := blockproto.ParseChallenge(msg)
	if err != nil {
		return err
	}
	s.challenge = bytes.Clone(ch)
	return nil
}

// sendProof sends a PROOF carrying mac and records it.
func (s *rawSess) sendProof(mac []byte) error {
	s.proof = bytes.Clone(blockproto.EncodeProof(make([]byte, blockproto.ProofMsgLen), mac))
	return s.send(s.proof)
}

// recvWelcome reads the WELCOME (a REJECT is a *rawReject error), checks
// the target's proof with secret and takes the grants.
func (s *rawSess) recvWelcome(secret []byte) error {
	msg, err := s.recvMsg()
	if err != nil {
		return err
	}
	if r := asReject(msg); r != nil {
		return r
	}
	w, err := blockproto.ParseWelcome(msg)
	if err != nil {
		return err
	}
	s.welcome = bytes.Clone(w)
	tp, err := blockproto.TargetProof(secret, s.login, s.challenge, s.proof, s.welcome)
	if err != nil || !bytes.Equal(tp[:], s.welcome.TargetProof()) {
		return fmt.Errorf("raw session: the WELCOME's target proof does not verify (%v)", err)
	}
	for i := 0; i < s.welcome.GrantCount(); i++ {
		s.grants = append(s.grants, s.welcome.Grant(i).Fields())
	}
	return nil
}

// doLogin runs a whole login as name with secret.
func (s *rawSess) doLogin(name string, secret []byte, credits uint16) error {
	if err := s.sendLogin(name, credits); err != nil {
		return err
	}
	if err := s.recvChallenge(); err != nil {
		return err
	}
	mac := proofMAC(secret, s.login, s.challenge)
	if len(secret) > 0 {
		want, err := blockproto.InitiatorProof(secret, s.login, s.challenge)
		if err != nil || !bytes.Equal(want[:], mac) {
			return fmt.Errorf("raw session: proofMAC disagrees with blockproto.InitiatorProof (%v)", err)
		}
	}
	if err := s.sendProof(mac); err != nil {
		return err
	}
	return s.recvWelcome(secret)
}

// takeGrant removes and returns an outstanding write grant.
func (s *rawSess) takeGrant() (blockproto.GrantFields, error) {
	if len(s.grants) == 0 {
		return blockproto.GrantFields{}, errors.New("raw session: no write grant left")
	}
	g := s.grants[0]
	s.grants = s.grants[1:]
	return g, nil
}

func (s *rawSess) addGrant(g blockproto.Grant) {
	if g.STag() != 0 {
		s.grants = append(s.grants, g.Fields())
	}
}

// command sends a command on slot (as a Send with Invalidate of f.STag
// when inv) and returns its tag.
func (s *rawSess) command(f blockproto.CommandFields, slot uint16, inv bool) (uint32, error) {
	s.seq++
	f.Tag = s.seq<<16 | uint32(slot)
	b := make([]byte, blockproto.CommandLen)
	blockproto.Command(b).Encode(&f)
	if inv {
		return f.Tag, s.sendInv(f.STag, b)
	}
	return f.Tag, s.send(b)
}

// response reads the RESPONSE to tag and keeps its grant.
func (s *rawSess) response(tag uint32) (blockproto.Response, error) {
	msg, err := s.recvMsg()
	if err != nil {
		return nil, err
	}
	r, err := blockproto.ParseResponse(msg)
	if err != nil {
		return nil, fmt.Errorf("raw session: expected RESPONSE: %w", err)
	}
	if r.Tag() != tag || r.Op() != blockproto.OpResponse {
		return nil, fmt.Errorf("raw session: %s tag %#x, waiting for the RESPONSE to %#x", r.Op(), r.Tag(), tag)
	}
	s.addGrant(r.Grant())
	return r, nil
}

// rdmaWrite writes data at stag/to in segments of at most 16 KiB.
func (s *rawSess) rdmaWrite(stag uint32, to uint64, data []byte) error {
	const seg = 16 << 10
	for off := 0; ; off += seg {
		end := min(off+seg, len(data))
		if err := s.p.Send(s.p.Tagged(rdmap.OpWrite, end == len(data), stag, to+uint64(off), bytes.Clone(data[off:end]))); err != nil {
			return err
		}
		if end == len(data) {
			return nil
		}
	}
}

// write stores data at off (a multiple of 512, len(data) at most a grant)
// through a write grant and a WRITE.
func (s *rawSess) write(off uint64, data []byte) error {
	g, err := s.takeGrant()
	if err != nil {
		return err
	}
	return s.writeVia(g, off, data)
}

// writeVia places data into grant g and sends the WRITE naming it.
func (s *rawSess) writeVia(g blockproto.GrantFields, off uint64, data []byte) error {
	if err := s.rdmaWrite(g.STag, g.TO+off%4096, data); err != nil {
		return err
	}
	return s.commit(g, off, len(data))
}

// commit sends the WRITE of n bytes at off naming grant g (its data
// already placed) and checks the RESPONSE.
func (s *rawSess) commit(g blockproto.GrantFields, off uint64, n int) error {
	tag, err := s.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: off, Length: uint32(n), STag: g.STag}, 0, true)
	if err != nil {
		return err
	}
	r, err := s.response(tag)
	if err != nil {
		return err
	}
	if r.Status() != blockproto.StatusOK {
		return fmt.Errorf("raw session: WRITE at %d: %s %s", off, r.Status(), r.Detail())
	}
	return nil
}

// ready sends READ on slot and returns the READY's buffer descriptor.
func (s *rawSess) ready(off uint64, n uint32, slot uint16) (blockproto.GrantFields, error) {
	tag, err := s.command(blockproto.CommandFields{Op: blockproto.OpRead, Offset: off, Length: n}, slot, false)
	if err != nil {
		return blockproto.GrantFields{}, err
	}
	msg, err := s.recvMsg()
	if err != nil {
		return blockproto.GrantFields{}, err
	}
	r, err := blockproto.ParseReady(msg)
	if err != nil {
		return blockproto.GrantFields{}, fmt.Errorf("raw session: expected READY: %w (%x)", err, msg)
	}
	if r.Tag() != tag {
		return blockproto.GrantFields{}, fmt.Errorf("raw session: READY tag %#x, want %#x", r.Tag(), tag)
	}
	s.addGrant(r.Grant())
	return r.Buffer().Fields(), nil
}

// readRequest builds a Read Request for n bytes of stag at to.
func (s *rawSess) readRequest(stag uint32, to uint64, n uint32) []byte {
	return s.p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: rawSinkSTag, SinkTO: 0, Size: n, SrcSTag: stag, SrcTO: to})
}

// rdmaRead reads n bytes of stag at to.
func (s *rawSess) rdmaRead(stag uint32, to uint64, n uint32) ([]byte, error) {
	if err := s.p.Send(s.readRequest(stag, to, n)); err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	for {
		ev, err := s.next()
		if err != nil {
			return nil, err
		}
		if !ev.readResp || ev.stag != rawSinkSTag || ev.to+uint64(len(ev.data)) > uint64(n) {
			return nil, fmt.Errorf("raw session: %+v while reading", ev)
		}
		copy(buf[ev.to:], ev.data)
		if ev.last {
			return buf, nil
		}
	}
}

// release ends a READ's exchange on slot.
func (s *rawSess) release(stag uint32, slot uint16) error {
	_, err := s.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: stag}, slot, true)
	return err
}

// read reads n bytes at off: READ, RDMA Read of the READY buffer, RELEASE.
func (s *rawSess) read(off uint64, n uint32) ([]byte, error) {
	b, err := s.ready(off, n, 0)
	if err != nil {
		return nil, err
	}
	data, err := s.rdmaRead(b.STag, b.TO, n)
	if err != nil {
		return nil, err
	}
	return data, s.release(b.STag, 0)
}

// fetchAdd runs an RFC 7306 Fetch-and-Add on stag/to and returns the
// original value.
func (s *rawSess) fetchAdd(stag uint32, to, add uint64) (uint64, error) {
	s.reqID++
	id := s.reqID
	if err := s.p.Send(s.p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: id, STag: stag,
		TO: to, AddSwap: add, CompareMask: ^uint64(0)})); err != nil {
		return 0, err
	}
	ev, err := s.next()
	if err != nil {
		return 0, err
	}
	if !ev.atomic || ev.reqID != id {
		return 0, fmt.Errorf("raw session: %+v while waiting for Atomic Response %d", ev, id)
	}
	return ev.orig, nil
}

// flush sends FLUSH and checks the RESPONSE.
func (s *rawSess) flush() error {
	tag, err := s.command(blockproto.CommandFields{Op: blockproto.OpFlush}, 0, false)
	if err != nil {
		return err
	}
	r, err := s.response(tag)
	if err != nil {
		return err
	}
	if r.Status() != blockproto.StatusOK {
		return fmt.Errorf("raw session: FLUSH: %s", r.Status())
	}
	return nil
}
