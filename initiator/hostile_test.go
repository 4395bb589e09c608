package initiator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// The volume of TestHostilePeers (64 MiB). Only honest sessions write, each
// in its own part, and the test keeps a model of every byte: the store
// must equal it.
const (
	hpSize      = 64 << 20
	hpHonestEnd = 4 << 20  // the background initiator writes below this
	hpVictim    = 16 << 20 // the victim (a raw, honest session): 8 MiB of blocks
	hpSentinel  = 32 << 20 // 1 MiB of 0xA5
	hpSource    = 40 << 20 // 1 MiB of known data that hostile sessions READ
	hpRawWrites = 48 << 20 // what a well-behaved raw session writes (reserved bits)
	hpIRD       = 8        // the target's IRD (inbound Reads and atomics per QP)
)

// hostileRun is the state of TestHostilePeers: the target, the model of
// the volume, the store's view of it, and the victim session whose real
// STags hostile sessions aim at.
type hostileRun struct {
	e   *env
	ctx context.Context
	vol store.Volume

	mu    sync.Mutex
	model []byte

	victim *rawSess
	vnext  uint64 // offset of the victim's next block (in its part)

	// The honest session (an initiator) writes and verifies in the
	// background, each write+read under pause's read lock.
	honest *initiator.Client
	pause  sync.RWMutex

	honestErr atomic.Pointer[error]
	ios       atomic.Int64
	lastIO    atomic.Int64 // UnixNano of the honest session's last verified I/O
	maxGap    atomic.Int64 // longest time between two of its I/Os
}

// record notes bytes an honest session wrote.
func (h *hostileRun) record(off uint64, b []byte) {
	h.mu.Lock()
	copy(h.model[off:], b)
	h.mu.Unlock()
}

func (h *hostileRun) expect(off uint64, n int) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return bytes.Clone(h.model[off : off+uint64(n)])
}

// storeCheck reads the volume through the store API from byte from to the
// end and fails at the first byte that is not what honest sessions wrote.
func (h *hostileRun) storeCheck(t *testing.T, from uint64) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for off := from; off < hpSize; off += uint64(len(buf)) {
		if err := h.vol.ReadBlocks(h.ctx, off/store.BlockSize, buf); err != nil {
			t.Fatalf("store read at %d: %v", off, err)
		}
		h.mu.Lock()
		want := h.model[off : off+uint64(len(buf))]
		if !bytes.Equal(buf, want) {
			i := 0
			for buf[i] == want[i] {
				i++
			}
			got, w := buf[i], want[i]
			h.mu.Unlock()
			t.Fatalf("the store differs from what honest sessions wrote at byte %d (%#x): %#02x, want %#02x",
				off+uint64(i), off+uint64(i), got, w)
		}
		h.mu.Unlock()
	}
}

// fullCheck pauses the honest session's background I/O, reads its whole
// region back through it, and compares the whole volume in the store with
// the model.
func (h *hostileRun) fullCheck(t *testing.T) {
	t.Helper()
	h.pause.Lock()
	defer h.pause.Unlock()
	back := make([]byte, hpHonestEnd)
	if err := h.honest.ReadAt(h.ctx, back, 0); err != nil {
		t.Fatalf("the honest session reads its region back: %v", err)
	}
	if want := h.expect(0, hpHonestEnd); !bytes.Equal(back, want) {
		i := 0
		for back[i] == want[i] {
			i++
		}
		t.Fatalf("the honest session's region differs at byte %d: %#02x, want %#02x", i, back[i], want[i])
	}
	h.storeCheck(t, 0)
}

// honestOK fails if the background initiator failed.
func (h *hostileRun) honestOK(t *testing.T) {
	t.Helper()
	if p := h.honestErr.Load(); p != nil {
		t.Fatalf("the honest session failed: %v", *p)
	}
}

// victimBlock returns the offset of a fresh victim block and its new content.
func (h *hostileRun) victimBlock() (uint64, []byte) {
	off := hpVictim + h.vnext
	h.vnext = (h.vnext + 4096) % (8 << 20)
	data := make([]byte, 4096)
	r := rand.New(rand.NewPCG(off, uint64(time.Now().UnixNano())))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return off, data
}

// victimCycle: the victim writes a fresh block and reads it back.
func (h *hostileRun) victimCycle(t *testing.T) {
	t.Helper()
	off, data := h.victimBlock()
	if err := h.victim.write(off, data); err != nil {
		t.Fatalf("the victim session's write: %v", err)
	}
	h.record(off, data)
	back, err := h.victim.read(off, 4096)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("the victim session reads back its block: %v (equal %v)", err, bytes.Equal(back, data))
	}
}

// victimLockWords reads the reservation word and the generation counter
// of the volume's lock table through the victim's registration.
func (h *hostileRun) victimLockWords(t *testing.T) [2]uint64 {
	t.Helper()
	var w [2]uint64
	for i := range w {
		v, err := h.victim.fetchAdd(h.victim.welcome.LockSTag(), h.victim.welcome.LockTO()+8*uint64(i), 0)
		if err != nil {
			t.Fatalf("the victim reads lock word %d: %v", i, err)
		}
		w[i] = v
	}
	return w
}

// hpWant is what a hostile case expects.
type hpWant struct {
	none  bool // no Terminate: the frames were legal and the session worked
	cause term.Cause
	// off is the offending ULPDU as sent: its DDP header (and DDP segment
	// length) must be echoed; nil: nothing may be echoed.
	off []byte
	// rdma: off is a Read Request whose RDMA header is echoed too (R).
	rdma bool
	// readsOK: Read Responses may come before the Terminate (they are
	// checked against the model); otherwise any is a leak.
	readsOK bool
	// check replaces the echo check.
	check func(t *testing.T, tm *rawpeer.Terminate, before [][]byte)
	// after runs once the connection is gone.
	after func(t *testing.T)
}

type hpCase struct {
	name  string
	login bool // log in first: a session of its own, with real STags
	opts  rawpeer.Options
	run   func(t *testing.T, h *hostileRun, s *rawSess) hpWant
}

// checkEcho checks the headers a Terminate echoes (RFC 5040 §4.8, §7.1,
// Figure 10): the offending DDP header and segment length for every error
// tied to a segment except LLP and local catastrophic ones, the Read
// Request header for Remote Protection errors of a Read Request, nothing
// else.
func checkEcho(t *testing.T, tm *rawpeer.Terminate, off []byte, rdma bool) {
	t.Helper()
	if off == nil {
		if tm.M || tm.D || tm.R || len(tm.DDPHeader) > 0 || len(tm.RDMAHeader) > 0 {
			t.Fatalf("Terminate %v echoes headers (M %v D %v R %v, %x %x), none belong", tm.Cause, tm.M, tm.D, tm.R,
				tm.DDPHeader, tm.RDMAHeader)
		}
		return
	}
	hl := ddp.UntaggedHeaderLen
	if ddp.IsTagged(off[0]) {
		hl = ddp.TaggedHeaderLen
	}
	// A header cut short by its segment is echoed zero-padded to the
	// length its T bit gives.
	hdr := make([]byte, hl)
	copy(hdr, off)
	if !tm.M || !tm.D || int(tm.SegLen) != len(off) || !bytes.Equal(tm.DDPHeader, hdr) {
		t.Fatalf("Terminate %v echoes M %v D %v segment length %d, DDP header %x; want M, D, %d, %x",
			tm.Cause, tm.M, tm.D, tm.SegLen, tm.DDPHeader, len(off), hdr)
	}
	if rdma {
		if !tm.R || !bytes.Equal(tm.RDMAHeader, off[hl:hl+rdmap.ReadRequestLen]) {
			t.Fatalf("Terminate %v echoes R %v RDMA header %x, want the Read Request header %x", tm.Cause, tm.R,
				tm.RDMAHeader, off[hl:hl+rdmap.ReadRequestLen])
		}
	} else if tm.R || len(tm.RDMAHeader) > 0 {
		t.Fatalf("Terminate %v echoes an RDMA header (R %v, %x): only a Read Request's is echoed", tm.Cause, tm.R, tm.RDMAHeader)
	}
}

// isReadResponse reports whether u is a Read Response segment, and its
// header.
func isReadResponse(u []byte) (ddp.Tagged, bool) {
	if len(u) < ddp.TaggedHeaderLen || !ddp.IsTagged(u[0]) || rdmap.Opcode(u[1]&0x0F) != rdmap.OpReadResponse {
		return nil, false
	}
	return ddp.Tagged(u[:ddp.TaggedHeaderLen]), true
}

// runCase runs one hostile connection and every check after it.
func (h *hostileRun) runCase(t *testing.T, c hpCase) {
	s, err := rawDial(h.e.addr, c.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c.login {
		if err := s.doLogin("hostile-"+c.name, testSecret, 4); err != nil {
			t.Fatalf("login: %v", err)
		}
	}
	w := c.run(t, h, s)
	if w.none {
		s.Close()
	} else {
		tm, before, err := s.p.ReadTerminate(10 * time.Second)
		if err != nil {
			t.Fatalf("no Terminate: %v", err)
		}
		if tm.Cause != w.cause {
			t.Fatalf("Terminate %v, want %v", tm.Cause, w.cause)
		}
		if w.check != nil {
			w.check(t, tm, before)
		} else {
			checkEcho(t, tm, w.off, w.rdma)
		}
		for _, u := range before {
			if hd, ok := isReadResponse(u); ok && len(u) > ddp.TaggedHeaderLen && !w.readsOK {
				t.Fatalf("%d bytes of target memory sent before the Terminate (Read Response TO %d)",
					len(u)-ddp.TaggedHeaderLen, hd.TO())
			}
		}
		if err := s.p.WaitClosed(10 * time.Second); err != nil {
			t.Fatalf("the target kept the stream open after its Terminate: %v", err)
		}
		t.Logf("Terminate %v", tm.Cause)
	}
	if w.after != nil {
		w.after(t)
	}
	h.victimCycle(t)
	h.fullCheck(t)
	h.honestOK(t)
}

// hostileGuesses is the number of blind STag guesses over the wire
// (RNIC_HOSTILE_GUESSES, default 200).
func hostileGuesses(t *testing.T) int {
	n := 200
	if v := os.Getenv("RNIC_HOSTILE_GUESSES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			t.Fatalf("RNIC_HOSTILE_GUESSES=%q: %v", v, err)
		}
	}
	return n
}

// TestHostilePeers points byte-level hostile peers at a real target while
// an initiator (the honest session) keeps writing and verifying, and a raw
// but well-behaved session (the victim) holds real STags: write grants,
// READY buffers, its lock table registration. Each hostile connection
// completes MPA (most also log in, to hold real STags of their own) and
// sends one malformed or forbidden frame. It must get the exact Terminate
// (layer, type, code, and the echoed DDP and RDMA headers where RFC 5040
// §7.1 and Figure 10 put them), the connection must end, the victim's
// buffers and the lock table must be untouched (the victim then uses
// them), the store must hold exactly what honest sessions wrote, and both
// honest sessions must keep working. rnic/terminate_test.go runs the same
// classes against a bare engine; this is the target as deployed.
//
// Expectations that rest on the engine following the RFCs: Send with
// Invalidate of another session's STag is RDMA / Remote Protection / 0x09
// "STag cannot be Invalidated" (RFC 5040 §5.3);
// a bad DDP version and an untagged segment too short for its header echo
// the DDP header like every DDP error (Figure 10); RV 00b is valid, so the
// bad RDMAP versions are 10b and 11b (§4.1).
//
// RNIC_HOSTILE_GUESSES (default 200) sets the number of blind STag guesses
// over the wire, one connection each; for a long run (1e6) raise go test's
// -timeout too.
func TestHostilePeers(t *testing.T) {
	guesses := hostileGuesses(t)
	e := newEnv(t, envOpts{size: hpSize, tcfg: func(c *target.Config) { c.IRD = hpIRD }})
	// A long guessing run needs more than tctx's minute.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(guesses)*20*time.Millisecond)
	defer cancel()
	h := &hostileRun{e: e, ctx: ctx, model: make([]byte, hpSize)}
	var err error
	if h.vol, err = e.st.OpenVolume(ctx, "vol0"); err != nil {
		t.Fatal(err)
	}
	defer h.vol.Close()
	honest := e.client("honest", nil)
	h.honest = honest

	// The sentinel and the source region.
	sentinel := bytes.Repeat([]byte{0xA5}, 1<<20)
	if err := honest.WriteAt(ctx, sentinel, hpSentinel, true); err != nil {
		t.Fatal(err)
	}
	h.record(hpSentinel, sentinel)
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	if err := honest.WriteAt(ctx, src, hpSource, true); err != nil {
		t.Fatal(err)
	}
	h.record(hpSource, src)

	// The victim: an honest session of raw RDMA messages.
	if h.victim, err = rawDial(e.addr, rawpeer.Options{}); err != nil {
		t.Fatal(err)
	}
	defer h.victim.Close()
	if err := h.victim.doLogin("victim", testSecret, 4); err != nil {
		t.Fatalf("victim login: %v", err)
	}
	h.victimCycle(t)

	// The honest initiator writes and verifies in the background.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	h.lastIO.Store(time.Now().UnixNano())
	go func() {
		defer wg.Done()
		fail := func(err error) { h.honestErr.Store(&err) }
		r := rand.New(rand.NewPCG(1, 2))
		buf, back := make([]byte, 8192), make([]byte, 8192)
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.pause.RLock()
			ok := func() bool {
				defer h.pause.RUnlock()
				off := int64(r.IntN(hpHonestEnd/8192)) * 8192
				for i := range buf {
					buf[i] = byte(r.Uint32())
				}
				if err := honest.WriteAt(ctx, buf, off, false); err != nil {
					fail(err)
					return false
				}
				h.record(uint64(off), buf)
				if err := honest.ReadAt(ctx, back, off); err != nil {
					fail(err)
					return false
				}
				if !bytes.Equal(back, buf) {
					fail(fmt.Errorf("read back differs at %d", off))
					return false
				}
				return true
			}()
			if !ok {
				return
			}
			h.ios.Add(1)
			now := time.Now().UnixNano()
			if gap := now - h.lastIO.Swap(now); gap > h.maxGap.Load() {
				h.maxGap.Store(gap)
			}
		}
	}()
	stopHonest := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopHonest()

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
	send := func(t *testing.T, s *rawSess, u []byte) []byte {
		t.Helper()
		if err := s.p.Send(u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	grant := func(t *testing.T, s *rawSess) blockproto.GrantFields {
		t.Helper()
		g, err := s.takeGrant()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	ready := func(t *testing.T, s *rawSess, off uint64, n uint32) blockproto.GrantFields {
		t.Helper()
		b, err := s.ready(off, n, 1)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	fill := func(n int, v byte) []byte { return bytes.Repeat([]byte{v}, n) }
	// lockUnchanged reads the lock words through the victim before the
	// hostile frame and returns the check to run after it.
	lockUnchanged := func(t *testing.T) func(t *testing.T) {
		before := h.victimLockWords(t)
		return func(t *testing.T) {
			if now := h.victimLockWords(t); now != before {
				t.Fatalf("lock table words 0-1 changed from %#x to %#x", before, now)
			}
		}
	}

	cases := []hpCase{
		// Blind guesses and malformed headers.
		{name: "write-guessed-stag", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: ddpTagged(term.TaggedInvalidSTag), off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, guess(), 0, fill(512, 1)))}
		}},
		{name: "write-stag-zero", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: ddpTagged(term.TaggedInvalidSTag), off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, 0, 0, []byte{1, 2, 3, 4}))}
		}},
		{name: "read-guessed-stag", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: prot(term.ProtInvalidSTag), off: send(t, s, s.readRequest(guess(), 0, 4096)), rdma: true}
		}},
		{name: "atomic-guessed-stag", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: prot(term.ProtInvalidSTag), off: send(t, s, s.p.AtomicRequest(rdmap.AtomicRequestFields{
				AOpcode: rdmap.AtomicFetchAdd, STag: guess(), AddSwap: 1, CompareMask: ^uint64(0)}))}
		}},
		// A misaligned TO is checked after the STag (RFC 7306 §5.2.1: the
		// alignment is that of the target word's address, known only
		// from a valid STag): the guessed STag fails first.
		{name: "atomic-misaligned", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: prot(term.ProtInvalidSTag), off: send(t, s, s.p.AtomicRequest(rdmap.AtomicRequestFields{
				AOpcode: rdmap.AtomicFetchAdd, STag: guess(), TO: 3, AddSwap: 1, CompareMask: ^uint64(0)}))}
		}},
		{name: "unknown-opcode", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: remoteOp(term.OpUnexpectedOpcode), off: send(t, s, s.p.Untagged(rdmap.Opcode(0xF), true, 0, 0, s.p.NextMSN(0), 0, nil))}
		}},
		{name: "wrong-qn", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: ddpUntagged(term.UntaggedInvalidQN), off: send(t, s, s.p.Untagged(rdmap.OpSend, true, 0, 5, 1, 0, []byte("x")))}
		}},
		{name: "msn-out-of-window", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: ddpUntagged(term.UntaggedMSNRange), off: send(t, s, s.p.Untagged(rdmap.OpSend, true, 0, 0, 1<<30, 0, []byte("x")))}
		}},
		{name: "send-inv-guessed-stag", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			return hpWant{cause: prot(term.ProtInvalidSTag), off: send(t, s, s.p.SendMsg(rdmap.OpSendInv, guess(), make([]byte, 32)))}
		}},
		{name: "bad-crc", opts: rawpeer.Options{CRC: true}, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			if err := s.p.SendBadCRC(s.p.Tagged(rdmap.OpWrite, true, guess(), 0, []byte{1, 2, 3, 4})); err != nil {
				t.Fatal(err)
			}
			return hpWant{cause: term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPACRC}}
		}},

		// Bad lengths.
		{name: "ulpdu-shorter-than-ddp-header", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			// ULPDU_LENGTH 10: no DDP header (14 or 18 bytes) fits; the
			// framing itself is lost (LLP / MPA / 0x03), nothing echoed.
			u := s.p.Tagged(rdmap.OpWrite, true, guess(), 0, nil)[:10]
			if err := s.p.SendRaw(mpa.AppendFPDU(nil, u, nil, s.p.CRC)); err != nil {
				t.Fatal(err)
			}
			return hpWant{cause: term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPAMarker}}
		}},
		{name: "untagged-segment-shorter-than-its-header", run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			// 16 bytes with T=0: the untagged header is 18. DDP cannot
			// read its own header: Invalid DDP Version (1/2/0x06), the
			// bytes there are echoed.
			u := s.p.SendMsg(rdmap.OpSend, 0, nil)[:16]
			if err := s.p.SendRaw(mpa.AppendFPDU(nil, u, nil, s.p.CRC)); err != nil {
				t.Fatal(err)
			}
			return hpWant{cause: ddpUntagged(term.UntaggedInvalidVersion), off: u}
		}},
		{name: "send-longer-than-receive-buffer", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			// The target's receive buffers are blockproto.MaxMessage bytes.
			return hpWant{cause: ddpUntagged(term.UntaggedTooLong),
				off: send(t, s, s.p.SendMsg(rdmap.OpSend, 0, make([]byte, blockproto.MaxMessage+1)))}
		}},

		// Reserved bits: ignored on receive (RFC 5044 §7.1 Res, RFC 5041
		// Rsvd, RFC 5040 §4.1 Rsv and the Invalidate STag of messages
		// without Invalidate, RFC 7306 atomic Reserved). A whole session
		// with every reserved bit set works.
		{name: "reserved-bits", login: true, opts: func() rawpeer.Options {
			req, err := rawpeer.BuildRequest(rawpeer.Options{})
			if err != nil {
				panic(err)
			}
			req[16] |= 0x0F // the MPA Request's Res flag bits
			return rawpeer.Options{RawRequest: req, Mangle: func(u []byte) {
				u[0] |= 0x3C // DDP Rsvd
				u[1] |= 0x30 // RDMAP Rsv
				if ddp.IsTagged(u[0]) {
					return
				}
				op := rdmap.Opcode(u[1] & 0x0F)
				if !op.HasInvalidate() {
					copy(u[2:6], []byte{0xDE, 0xAD, 0xBE, 0xEF}) // Invalidate STag: ignored
				}
				if op == rdmap.OpAtomicRequest {
					u[18], u[19], u[20] = 0xFF, 0xFF, 0xFF // 28 reserved bits before the AOpcode
					u[21] |= 0xF0
				}
			}}
		}(), run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			data := make([]byte, 20<<10) // two RDMA Write segments
			for i := range data {
				data[i] = byte(i*13 + 5)
			}
			if err := s.write(hpRawWrites, data); err != nil {
				t.Fatalf("write with reserved bits set: %v", err)
			}
			h.record(hpRawWrites, data)
			back, err := s.read(hpRawWrites, uint32(len(data)))
			if err != nil || !bytes.Equal(back, data) {
				t.Fatalf("read back with reserved bits set: %v", err)
			}
			gen, err := s.fetchAdd(s.welcome.LockSTag(), s.welcome.LockTO()+8, 0)
			if err != nil {
				t.Fatalf("atomic with reserved bits set: %v", err)
			}
			if v := h.victimLockWords(t); v[1] != gen {
				t.Fatalf("the generation read with reserved bits set is %d, the victim reads %d", gen, v[1])
			}
			if err := s.flush(); err != nil {
				t.Fatal(err)
			}
			return hpWant{none: true}
		}},

		// Versions.
		{name: "bad-ddp-version", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			u := s.p.Tagged(rdmap.OpWrite, true, g.STag, g.TO, fill(4096, 0xD0))
			u[0] = u[0]&^0x03 | 0x02 // DV 10b
			// Echoes the DDP header like every DDP error (Figure 10).
			return hpWant{cause: ddpTagged(term.TaggedInvalidVersion), off: send(t, s, u)}
		}},
		{name: "rdmap-version-10b", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			u := s.p.Tagged(rdmap.OpWrite, true, g.STag, g.TO, fill(4096, 0xD1))
			u[1] = u[1]&^0xC0 | 0x80 // RV 10b (01b and 00b are valid, RFC 5040 §4.1)
			return hpWant{cause: remoteOp(term.OpInvalidVersion), off: send(t, s, u)}
		}},
		{name: "rdmap-version-11b", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			u := s.p.SendMsg(rdmap.OpSend, 0, make([]byte, blockproto.CommandLen))
			u[1] |= 0xC0 // RV 11b
			return hpWant{cause: remoteOp(term.OpInvalidVersion), off: send(t, s, u)}
		}},

		// More outstanding Read Requests than the target's IRD: each asks
		// for a 1 MiB READY buffer that a peer which does not read cannot
		// take, so none completes before the (IRD+1)-th arrives; the
		// echoed header says which one hit the limit.
		{name: "read-past-ird", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			const size = 1 << 20
			b := ready(t, s, hpSource, size)
			var reqs [][]byte
			var wire []byte
			for i := 0; i < 3*hpIRD; i++ {
				u := s.readRequest(b.STag, b.TO, size)
				reqs = append(reqs, u)
				wire = append(wire, s.p.Frame(u)...)
			}
			if err := s.p.SendRaw(wire); err != nil {
				t.Fatal(err)
			}
			return hpWant{cause: ddpUntagged(term.UntaggedNoBuffer), readsOK: true,
				check: func(t *testing.T, tm *rawpeer.Terminate, before [][]byte) {
					done := 0 // Read Responses completed before the Terminate
					for _, u := range before {
						hd, ok := isReadResponse(u)
						if !ok {
							t.Fatalf("unexpected segment %x before the Terminate", u[:min(len(u), 32)])
						}
						if want := h.expect(hpSource+hd.TO(), len(u)-ddp.TaggedHeaderLen); hd.STag() != rawSinkSTag ||
							!bytes.Equal(u[ddp.TaggedHeaderLen:], want) {
							t.Fatalf("Read Response at TO %d is not the READY buffer's data", hd.TO())
						}
						if hd.Last() {
							done++
						}
					}
					if len(tm.DDPHeader) != ddp.UntaggedHeaderLen {
						t.Fatalf("Terminate echoes DDP header %x, want a Read Request's", tm.DDPHeader)
					}
					msn := int(ddp.Untagged(tm.DDPHeader).MSN())
					if msn < hpIRD+1 || msn > hpIRD+1+done || msn > len(reqs) {
						t.Fatalf("Terminate for Read Request %d, want the first beyond IRD %d (%d responses completed)",
							msn, hpIRD, done)
					}
					checkEcho(t, tm, reqs[msn-1], false)
					t.Logf("Read Request %d of %d refused (IRD %d, %d responses completed)", msn, len(reqs), hpIRD, done)
				}}
		}},

		// Real STags of another session (another PD and QP): the victim's.
		{name: "write-foreign-grant", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g, err := h.victim.takeGrant()
			if err != nil {
				t.Fatal(err)
			}
			off, data := h.victimBlock()
			// The victim's data is in its grant before the hostile write
			// (the atomic round trip orders them), and its WRITE comes
			// after: the store must get the victim's bytes.
			if err := h.victim.rdmaWrite(g.STag, g.TO+off%4096, data); err != nil {
				t.Fatal(err)
			}
			h.victimLockWords(t)
			u := send(t, s, s.p.Tagged(rdmap.OpWrite, true, g.STag, g.TO+off%4096, fill(4096, 0x66)))
			return hpWant{cause: ddpTagged(term.TaggedNotAssociated), off: u, after: func(t *testing.T) {
				if err := h.victim.commit(g, off, len(data)); err != nil {
					t.Fatalf("the victim's WRITE through the grant: %v", err)
				}
				h.record(off, data)
			}}
		}},
		{name: "read-foreign-ready", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			b, err := h.victim.ready(hpSource, 4096, 1)
			if err != nil {
				t.Fatal(err)
			}
			u := send(t, s, s.readRequest(b.STag, b.TO, 4096))
			return hpWant{cause: prot(term.ProtSTagNotAssociated), off: u, rdma: true, after: func(t *testing.T) {
				data, err := h.victim.rdmaRead(b.STag, b.TO, 4096)
				if err != nil || !bytes.Equal(data, h.expect(hpSource, 4096)) {
					t.Fatalf("the victim reads its READY buffer: %v", err)
				}
				if err := h.victim.release(b.STag, 1); err != nil {
					t.Fatal(err)
				}
			}}
		}},
		{name: "atomic-foreign-lock-table", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			after := lockUnchanged(t)
			u := send(t, s, s.p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd,
				STag: h.victim.welcome.LockSTag(), TO: h.victim.welcome.LockTO() + 8, AddSwap: 1 << 40, CompareMask: ^uint64(0)}))
			return hpWant{cause: prot(term.ProtSTagNotAssociated), off: u, after: after}
		}},
		{name: "send-inv-foreign-grant", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g, err := h.victim.takeGrant()
			if err != nil {
				t.Fatal(err)
			}
			// A WRITE naming the victim's grant, sent as a Send with
			// Invalidate of it: RFC 5040 §5.3, the STag cannot be
			// invalidated from this stream.
			cmd := make([]byte, blockproto.CommandLen)
			blockproto.Command(cmd).Encode(&blockproto.CommandFields{Op: blockproto.OpWrite, Tag: 1 << 16, Offset: hpVictim,
				Length: 4096, STag: g.STag})
			u := send(t, s, s.p.SendMsg(rdmap.OpSendInv, g.STag, cmd))
			return hpWant{cause: prot(term.ProtCannotInvalidate), off: u, after: func(t *testing.T) {
				off, data := h.victimBlock()
				if err := h.victim.writeVia(g, off, data); err != nil {
					t.Fatalf("the victim's grant after a foreign invalidate: %v", err)
				}
				h.record(off, data)
			}}
		}},

		// Real STags of this session, misused.
		{name: "wrong-key", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			return hpWant{cause: ddpTagged(term.TaggedInvalidSTag),
				off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, g.STag^0x5A, g.TO, fill(4096, 0x77)))}
		}},
		{name: "write-to-out-of-range", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			return hpWant{cause: ddpTagged(term.TaggedBaseBounds),
				off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, g.STag, g.TO+uint64(g.Len)-2, []byte{1, 2, 3, 4}))}
		}},
		{name: "write-to-wrap", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			// TO 2^64-2 + 4 bytes wraps to 2, inside the grant for an
			// engine that adds before it compares. Every STag the target
			// advertises is zero-based, so the TO lies outside [0, len)
			// and the check that fails first is base/bounds (RFC 5041
			// order: range before wrap); the wrap code itself needs a
			// region ending at 2^64 (rnic/terminate_test.go).
			g := grant(t, s)
			return hpWant{cause: ddpTagged(term.TaggedBaseBounds),
				off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, g.STag, ^uint64(0)-1, []byte{1, 2, 3, 4}))}
		}},
		{name: "read-to-wrap", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			b := ready(t, s, hpSource, 4096)
			return hpWant{cause: prot(term.ProtBaseBounds), off: send(t, s, s.readRequest(b.STag, ^uint64(0)-1, 4)), rdma: true}
		}},
		{name: "read-past-end", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			b := ready(t, s, hpSource, 4096)
			return hpWant{cause: prot(term.ProtBaseBounds), off: send(t, s, s.readRequest(b.STag, b.TO, 4097)), rdma: true}
		}},
		{name: "write-into-read-only-ready", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			// DDP has no access-rights code: a Write into an STag without
			// Remote Write is Invalid STag (as siw).
			b := ready(t, s, hpSource, 4096)
			return hpWant{cause: ddpTagged(term.TaggedInvalidSTag), off: send(t, s, s.p.Tagged(rdmap.OpWrite, true, b.STag, b.TO, fill(4096, 0x99)))}
		}},
		{name: "read-write-only-grant", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			return hpWant{cause: prot(term.ProtAccessRights), off: send(t, s, s.readRequest(g.STag, g.TO, 4096)), rdma: true}
		}},
		{name: "atomic-on-grant", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			g := grant(t, s)
			return hpWant{cause: prot(term.ProtAccessRights), off: send(t, s, s.p.AtomicRequest(rdmap.AtomicRequestFields{
				AOpcode: rdmap.AtomicFetchAdd, STag: g.STag, TO: g.TO, AddSwap: 1, CompareMask: ^uint64(0)}))}
		}},
		{name: "write-into-lock-table", login: true, run: func(t *testing.T, h *hostileRun, s *rawSess) hpWant {
			after := lockUnchanged(t)
			u := send(t, s, s.p.Tagged(rdmap.OpWrite, true, s.welcome.LockSTag(), s.welcome.LockTO(), fill(16, 0xFF)))
			return hpWant{cause: ddpTagged(term.TaggedInvalidSTag), off: u, after: after}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { h.runCase(t, c) })
	}

	// Blind guessing over the wire: one guess per connection, each ends it
	// with the exact Terminate.
	t.Run("network-guesses", func(t *testing.T) {
		began := time.Now()
		for i := 0; i < guesses; i++ {
			s, err := rawDial(e.addr, rawpeer.Options{})
			if err != nil {
				t.Fatal(err)
			}
			to := uint64(rnd.IntN(1 << 20))
			var w hpWant
			if i%2 == 1 {
				w = hpWant{cause: prot(term.ProtInvalidSTag), off: s.readRequest(guess(), to, 4096), rdma: true}
			} else {
				w = hpWant{cause: ddpTagged(term.TaggedInvalidSTag), off: s.p.Tagged(rdmap.OpWrite, true, guess(), to, fill(4096, 0xEE))}
			}
			if err := s.p.Send(w.off); err != nil {
				t.Fatal(err)
			}
			tm, before, err := s.p.ReadTerminate(10 * time.Second)
			if err != nil || tm.Cause != w.cause {
				t.Fatalf("guess %d (%x): Terminate %v (%v), want %v", i, w.off[:ddp.TaggedHeaderLen], tm, err, w.cause)
			}
			checkEcho(t, tm, w.off, w.rdma)
			if len(before) > 0 {
				t.Fatalf("guess %d: %d segments before the Terminate", i, len(before))
			}
			s.Close()
			if (i+1)%1000 == 0 {
				h.honestOK(t)
				t.Logf("%d guesses refused (%.0f/s)", i+1, float64(i+1)/time.Since(began).Seconds())
			}
		}
		h.victimCycle(t)
		h.fullCheck(t)
		h.honestOK(t)
	})

	// Refused before RDMA mode, with no MPA Reply: an FPDU instead of the
	// Request, private data over 512 bytes (RFC 5044 §7.1), an FPDU sent
	// right after the Request, before the Reply.
	noReply := func(t *testing.T, o rawpeer.Options) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		p, err := rawpeer.Dial(dctx, e.addr, o)
		if err == nil {
			p.Close()
			t.Fatal("the target accepted the connection")
		}
		if !errors.Is(err, rawpeer.ErrNoReply) {
			t.Fatalf("%v, want the connection closed without an MPA Reply", err)
		}
		t.Logf("refused: %v", err)
	}
	mpaCases := []struct {
		name string
		opts func(t *testing.T) rawpeer.Options
	}{
		{"fpdu-instead-of-request", func(t *testing.T) rawpeer.Options {
			u := rawpeer.Peer{}
			return rawpeer.Options{RawRequest: mpa.AppendFPDU(nil, u.Tagged(rdmap.OpWrite, true, guess(), 0, fill(64, 0xAB)), nil, true)}
		}},
		{"oversized-private-data", func(t *testing.T) rawpeer.Options {
			req, err := rawpeer.BuildRequest(rawpeer.Options{PrivateData: make([]byte, mpa.MaxPrivateData-mpa.IRDORDLen)})
			if err != nil {
				t.Fatal(err)
			}
			req = append(req, 0x55)                                      // one byte more than the 512 allowed
			binary.BigEndian.PutUint16(req[18:20], mpa.MaxPrivateData+1) // PD_Length 513
			return rawpeer.Options{RawRequest: req}
		}},
		{"data-before-mpa-reply", func(t *testing.T) rawpeer.Options {
			u := rawpeer.Peer{}
			login := make([]byte, blockproto.MaxMessage)
			m, err := blockproto.EncodeLogin(login, &blockproto.LoginFields{Credits: 4, Initiator: "early", Volume: "vol0"})
			if err != nil {
				t.Fatal(err)
			}
			return rawpeer.Options{CRC: true, EarlyData: mpa.AppendFPDU(nil, u.SendMsg(rdmap.OpSend, 0, m), nil, true)}
		}},
	}
	for _, c := range mpaCases {
		t.Run(c.name, func(t *testing.T) {
			noReply(t, c.opts(t))
			h.victimCycle(t)
			h.fullCheck(t)
			h.honestOK(t)
		})
	}

	// The end: the honest session's whole region, the store and a third
	// client's view of the whole volume are exactly what honest sessions
	// wrote.
	stopHonest()
	h.honestOK(t)
	if h.ios.Load() == 0 {
		t.Fatal("the honest session did no I/O")
	}
	if gap := time.Duration(h.maxGap.Load()); gap > 5*time.Second {
		t.Errorf("the honest session stalled for %v while hostile peers ran", gap)
	}
	h.fullCheck(t)
	auditor := e.client("auditor", nil)
	all := make([]byte, hpSize)
	if err := auditor.ReadAt(ctx, all, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, h.expect(0, hpSize)) {
		t.Fatal("a third client reads the volume differently from what honest sessions wrote")
	}
	h.victimCycle(t)
	// Every case's connection is gone: only the honest, victim and
	// auditor sessions remain.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := e.tgt.Metrics().SessionsActive.Load()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d sessions active, want 3 (honest, victim, auditor)", n)
			break
		}
	}
	t.Logf("%d hostile connections (%d frame classes, %d refused before RDMA mode) and %d blind STag guesses refused; "+
		"the honest session did %d verified write+read pairs meanwhile (longest gap %v); store and a third client agree "+
		"with the model of all %d MiB", len(cases)+len(mpaCases)+guesses, len(cases), len(mpaCases), guesses, h.ios.Load(),
		time.Duration(h.maxGap.Load()).Round(time.Millisecond), hpSize>>20)
}
