package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// TestHostilePeers points byte-level hostile peers at a real target while
// a logged-in initiator keeps writing and verifying. Each peer completes
// MPA (or does not) and sends one malformed or forbidden frame; it must
// get the exact Terminate (or be refused before RDMA mode), the target's
// memory and store must be untouched, and the honest session must not
// notice. rnic/terminate_test.go runs the same classes against a bare
// engine with every memory region kind (and the cases that need a valid
// STag: IRD exceeded, rights, bounds, another PD); this is the target as
// deployed, where a peer can only guess.
func TestHostilePeers(t *testing.T) {
	e := newEnv(t, envOpts{size: 64 << 20})
	honest := e.client("honest", nil)
	ctx := tctx(t)

	// A sentinel region the hostile peers must never change.
	sentinel := bytes.Repeat([]byte{0xA5}, 1<<20)
	if err := honest.WriteAt(ctx, sentinel, 32<<20, true); err != nil {
		t.Fatal(err)
	}

	// The honest initiator writes and verifies in the background.
	stop := make(chan struct{})
	var ios atomic.Int64
	var wg sync.WaitGroup
	var honestErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(1, 2))
		buf, back := make([]byte, 8192), make([]byte, 8192)
		for {
			select {
			case <-stop:
				return
			default:
			}
			off := int64(r.IntN(1000)) * 8192
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			if err := honest.WriteAt(ctx, buf, off, false); err != nil {
				honestErr = err
				return
			}
			if err := honest.ReadAt(ctx, back, off); err != nil || !bytes.Equal(back, buf) {
				honestErr = err
				if err == nil {
					honestErr = errFmt("read back differs at %d", off)
				}
				return
			}
			ios.Add(1)
		}
	}()

	rnd := rand.New(rand.NewPCG(3, 4))
	guess := func() uint32 { return rnd.Uint32() | 1 } // never STag 0
	ddpTagged := func(c term.Code) term.Cause {
		return term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: c}
	}
	ddpUntagged := func(c term.Code) term.Cause {
		return term.Cause{Layer: term.LayerDDP, EType: term.DDPUntagged, Code: c}
	}
	prot := func(c term.Code) term.Cause {
		return term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: c}
	}
	remoteOp := func(c term.Code) term.Cause {
		return term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: c}
	}
	cases := []struct {
		name  string
		crc   bool
		frame func(p *rawpeer.Peer) error
		want  term.Cause
	}{
		{"write-guessed-stag", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Tagged(rdmap.OpWrite, true, guess(), 0, bytes.Repeat([]byte{1}, 512)))
		}, ddpTagged(term.TaggedInvalidSTag)},
		{"write-stag-zero", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Tagged(rdmap.OpWrite, true, 0, 0, []byte{1, 2, 3, 4}))
		}, ddpTagged(term.TaggedInvalidSTag)},
		{"write-to-wrap", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Tagged(rdmap.OpWrite, true, guess(), ^uint64(0)-1, []byte{1, 2, 3, 4}))
		}, ddpTagged(term.TaggedInvalidSTag)},
		{"read-guessed-stag", false, func(p *rawpeer.Peer) error {
			return p.Send(p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 4096, SrcSTag: guess(), SrcTO: 0}))
		}, prot(term.ProtInvalidSTag)},
		{"atomic-guessed-stag", false, func(p *rawpeer.Peer) error {
			return p.Send(p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, STag: guess(), TO: 0, AddSwap: 1,
				CompareMask: ^uint64(0)}))
		}, prot(term.ProtInvalidSTag)},
		{"atomic-misaligned", false, func(p *rawpeer.Peer) error {
			return p.Send(p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, STag: guess(), TO: 3, AddSwap: 1,
				CompareMask: ^uint64(0)}))
		}, remoteOp(term.OpCatastrophicStream)},
		{"unknown-opcode", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Untagged(rdmap.Opcode(0xF), true, 0, 0, p.NextMSN(0), 0, nil))
		}, remoteOp(term.OpUnexpectedOpcode)},
		{"wrong-qn", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Untagged(rdmap.OpSend, true, 0, 5, 1, 0, []byte("x")))
		}, ddpUntagged(term.UntaggedInvalidQN)},
		{"msn-out-of-window", false, func(p *rawpeer.Peer) error {
			return p.Send(p.Untagged(rdmap.OpSend, true, 0, 0, 1<<30, 0, []byte("x")))
		}, ddpUntagged(term.UntaggedMSNRange)},
		{"send-inv-foreign-stag", false, func(p *rawpeer.Peer) error {
			return p.Send(p.SendMsg(rdmap.OpSendInv, guess(), make([]byte, 32)))
		}, prot(term.ProtInvalidSTag)},
		{"bad-crc", true, func(p *rawpeer.Peer) error {
			return p.SendBadCRC(p.Tagged(rdmap.OpWrite, true, guess(), 0, []byte{1, 2, 3, 4}))
		}, term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPACRC}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			p, err := rawpeer.Dial(dctx, e.addr, rawpeer.Options{CRC: c.crc})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := c.frame(p); err != nil {
				t.Fatal(err)
			}
			tm, _, err := p.ReadTerminate(10 * time.Second)
			if err != nil {
				t.Fatalf("no Terminate: %v", err)
			}
			if tm.Cause != c.want {
				t.Fatalf("Terminate %v, want %v", tm.Cause, c.want)
			}
			if err := p.WaitClosed(10 * time.Second); err != nil {
				t.Fatalf("target kept the stream open after its Terminate: %v", err)
			}
		})
	}

	// Blind guessing over the wire: one guess per connection, each ends it.
	const netGuesses = 200
	t.Run("network-guesses", func(t *testing.T) {
		for i := 0; i < netGuesses; i++ {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			p, err := rawpeer.Dial(dctx, e.addr, rawpeer.Options{})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			op, to := rdmap.OpWrite, uint64(rnd.IntN(1<<20))
			if i%2 == 1 {
				err = p.Send(p.ReadRequest(rdmap.ReadRequestFields{SinkSTag: 1, Size: 4096, SrcSTag: guess(), SrcTO: to}))
			} else {
				err = p.Send(p.Tagged(op, true, guess(), to, bytes.Repeat([]byte{0xEE}, 4096)))
			}
			if err != nil {
				t.Fatal(err)
			}
			tm, _, err := p.ReadTerminate(10 * time.Second)
			p.Close()
			if err != nil || tm.Cause.Code != term.TaggedInvalidSTag && tm.Cause.Code != term.ProtInvalidSTag {
				t.Fatalf("guess %d: %v %v", i, tm, err)
			}
		}
	})

	// Refused before RDMA mode: data instead of an MPA Request, private
	// data over the 512-byte limit.
	t.Run("data-before-mpa", func(t *testing.T) {
		nc, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.Write(mpa.AppendFPDU(nil, []byte("\x41\x43 not an MPA request at all........."), nil, false))
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [256]byte
		for {
			if _, err := nc.Read(b[:]); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("target kept a connection that sent no MPA Request")
				}
				break
			}
		}
	})
	t.Run("oversized-private-data", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := rawpeer.Dial(dctx, e.addr, rawpeer.Options{PrivateData: make([]byte, 513)}); err == nil {
			t.Fatal("target accepted 513 bytes of private data")
		}
	})

	close(stop)
	wg.Wait()
	if honestErr != nil {
		t.Fatalf("the honest session failed while hostile peers ran: %v", honestErr)
	}
	if ios.Load() == 0 {
		t.Fatal("the honest session did no I/O")
	}
	back := make([]byte, len(sentinel))
	if err := honest.ReadAt(ctx, back, 32<<20); err != nil || !bytes.Equal(back, sentinel) {
		t.Fatalf("sentinel region changed (err %v)", err)
	}
	t.Logf("%d hostile frames and %d blind STag guesses refused; the honest session did %d verified write+read pairs meanwhile", len(cases)+2, netGuesses, ios.Load())
}

type errString string

func (e errString) Error() string { return string(e) }

func errFmt(f string, a ...any) error { return errString(fmtSprintf(f, a...)) }

var fmtSprintf = fmt.Sprintf
