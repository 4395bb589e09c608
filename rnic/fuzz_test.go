package rnic

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// FuzzEngineRx feeds arbitrary bytes, as the FPDU stream after the MPA
// exchange, into a QP in RTS and checks the engine's promises on any input:
// no panic, no hang, the stream ends when the input does, and a region with
// no remote rights is never touched. The seeds are well-formed exchanges
// aimed at the QP's regions (fixed keys, so the fuzzer can reach them).
//
// One device, PD and set of regions serve every input of a fuzzing worker:
// each input gets a fresh CQ and QP, and afterwards every region is zeroed
// and re-registered in place (same STag, valid again), so an input that
// invalidates a region cannot change what the next one sees.
func FuzzEngineRx(f *testing.F) {
	for _, s := range engineSeeds(f) {
		f.Add(s, true)
		f.Add(s, false)
	}
	rig := newFuzzRig(f)
	f.Cleanup(func() { rig.dev.Close() })
	f.Fuzz(func(t *testing.T, in []byte, crc bool) {
		rig.run(t, in, crc)
	})
}

const (
	fuzzKeyW     = 0x11
	fuzzKeyR     = 0x22
	fuzzKeyA     = 0x33
	fuzzKeyGuard = 0x44
	fuzzKeyRecv  = 0x55
)

// fuzzMR is a region of the rig with what it takes to re-register it.
type fuzzMR struct {
	mr  *MR
	buf []byte
	opt MROptions
}

type fuzzRig struct {
	dev              *Device
	pd               *PD
	w, r, a, g, recv fuzzMR
	guard            []byte
	// inspect, when set, runs after the stream ends and before the regions
	// are reset (TestEngineSeeds checks what the seeds placed). The end of
	// the input then waits until every Read and Atomic Response queued has
	// gone out: an atomic executes when its response is built, and a stream
	// that ends first never executes it.
	inspect func(t testing.TB)
}

func newFuzzRig(t testing.TB) *fuzzRig {
	d, err := Open(Config{Name: "fuzz", Logger: testLogger(), CloseTimeout: 200 * time.Millisecond, MaxMR: 64, MaxMW: 8,
		seed: &[32]byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	rig := &fuzzRig{dev: d, pd: pd, guard: bytes.Repeat([]byte{sentinel}, 4096)}
	reg := func(buf []byte, acc Access, key uint8) fuzzMR {
		o := MROptions{Access: acc, Key: key, FixedKey: true, ZeroBased: true}
		mr, err := pd.RegisterMR(Bytes(buf), o)
		if err != nil {
			t.Fatal(err)
		}
		return fuzzMR{mr: mr, buf: buf, opt: o}
	}
	rig.w = reg(make([]byte, 4096), LocalRead|LocalWrite|RemoteWrite, fuzzKeyW)
	rig.r = reg(make([]byte, 4096), LocalRead|RemoteRead, fuzzKeyR)
	rig.a = reg(make([]byte, 64), LocalWrite|RemoteAtomic, fuzzKeyA)
	rig.g = reg(rig.guard, LocalRead|LocalWrite, fuzzKeyGuard)
	rig.recv = reg(make([]byte, 256), LocalWrite, fuzzKeyRecv)
	return rig
}

// run feeds one input to a fresh QP and checks the promises; it leaves the
// rig as it found it.
func (rig *fuzzRig) run(t testing.TB, in []byte, crc bool) {
	cq, err := rig.dev.CreateCQ(64, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := rig.pd.CreateQP(QPConfig{SendCQ: cq, RecvCQ: cq, IRD: 4, ORD: 4, InboundRead: true, InboundWrite: true, InboundAtomic: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := qp.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{STag: rig.recv.mr.STag(), TO: uint64(i * 64), Len: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	nc := newInputConn(in)
	if err := qp.Attach(Stream{Conn: nc, CRC: crc, Rev: 2, MULPDU: 1024}); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	c := qp.conn // the stream cannot end before nc.start is closed
	qp.mu.Unlock()
	if rig.inspect != nil {
		nc.settled = func() bool { return !c.respPending() }
	}
	close(nc.start)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := qp.WaitState(ctx, StateError, StateIdle); err != nil {
		t.Fatalf("stream did not end after the input did (state %s): %v", qp.State(), err)
	}
	for _, done := range []chan struct{}{c.rxDone, c.txDone} {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("stream goroutines still running after the QP left RTS")
		}
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := cq.Destroy(); err != nil {
		t.Fatal(err)
	}
	for i, v := range rig.guard {
		if v != sentinel {
			t.Fatalf("region without remote rights written at %d", i)
		}
	}
	if rig.inspect != nil {
		rig.inspect(t)
	}
	for _, m := range []*fuzzMR{&rig.w, &rig.r, &rig.a, &rig.recv} {
		clear(m.buf)
	}
	for _, m := range []*fuzzMR{&rig.w, &rig.r, &rig.a, &rig.g, &rig.recv} {
		stag := m.mr.STag()
		if err := m.mr.Reregister(rig.pd, Bytes(m.buf), m.opt); err != nil {
			t.Fatal(err)
		}
		if m.mr.STag() != stag {
			t.Fatalf("re-registration moved STag %#x to %#x", stag, m.mr.STag())
		}
	}
}

// inputConn is the peer's side of a stream as a fixed input: reads return
// the input and then EOF, writes (whatever the engine answers) are dropped.
// Reads wait until start is closed.
type inputConn struct {
	start   chan struct{}
	r       bytes.Reader
	closed  atomic.Bool
	settled func() bool // if set, EOF waits (up to 5 s) until it is true
}

func newInputConn(in []byte) *inputConn {
	c := &inputConn{start: make(chan struct{})}
	c.r.Reset(in)
	return c
}

func (c *inputConn) Read(p []byte) (int, error) {
	<-c.start
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.r.Read(p)
	if err == io.EOF && c.settled != nil {
		for end := time.Now().Add(5 * time.Second); !c.settled() && time.Now().Before(end); {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return n, err
}

func (c *inputConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return len(p), nil
}

func (c *inputConn) Close() error                     { c.closed.Store(true); return nil }
func (c *inputConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *inputConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *inputConn) SetDeadline(time.Time) error      { return nil }
func (c *inputConn) SetReadDeadline(time.Time) error  { return nil }
func (c *inputConn) SetWriteDeadline(time.Time) error { return nil }

// rigSTags returns the (deterministic) STags of a fuzz rig's regions.
func rigSTags(t testing.TB) (w, r, a uint32) {
	rig := newFuzzRig(t)
	defer rig.dev.Close()
	return uint32(rig.w.mr.STag()), uint32(rig.r.mr.STag()), uint32(rig.a.mr.STag())
}

func engineSeeds(t testing.TB) [][]byte {
	w, r, a := rigSTags(t)
	var msn ddp.TxQueues
	fp := func(hdr, payload []byte) []byte { return mpa.AppendFPDU(nil, hdr, payload, true) }
	untagged := func(op rdmap.Opcode, qn uint32, inv uint32, payload []byte) []byte {
		h := make([]byte, ddp.UntaggedHeaderLen)
		ddp.Untagged(h).Encode(&ddp.UntaggedFields{Last: true, RsvdULP0: rdmap.Ctrl(op), RsvdULP1: inv, QN: qn, MSN: msn.Next(qn)})
		return fp(h, payload)
	}
	tagged := func(op rdmap.Opcode, stag uint32, to uint64, payload []byte) []byte {
		h := make([]byte, ddp.TaggedHeaderLen)
		ddp.Tagged(h).Encode(&ddp.TaggedFields{Last: true, RsvdULP: rdmap.Ctrl(op), STag: stag, TO: to})
		return fp(h, payload)
	}
	var rr [rdmap.ReadRequestLen]byte
	rdmap.ReadRequest(rr[:]).Encode(&rdmap.ReadRequestFields{SinkSTag: 1, Size: 64, SrcSTag: r})
	var ar [rdmap.AtomicRequestLen]byte
	rdmap.AtomicRequest(ar[:]).Encode(&rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 1, STag: a, TO: 8, AddSwap: 1})
	var imm [8]byte
	seeds := [][]byte{
		tagged(rdmap.OpWrite, 0, 0, nil),
		untagged(rdmap.OpSend, 0, 0, []byte("hello")),
		tagged(rdmap.OpWrite, w, 16, []byte("data")),
		untagged(rdmap.OpReadRequest, 1, 0, rr[:]),
		untagged(rdmap.OpAtomicRequest, 1, 0, ar[:]),
		untagged(rdmap.OpImmediate, 0, 0, imm[:]),
		untagged(rdmap.OpSendInv, 0, w, []byte("x")),
	}
	all := bytes.Join(seeds[1:], nil) // a whole valid exchange (seeds[0] ends any stream)
	return append(seeds, all)
}

// TestEngineSeeds runs the fuzz seeds as a plain test, and checks that the
// seed holding a whole valid exchange reaches the rig's regions (so the
// fuzzer starts from inputs that place data) and that the rig is whole again
// afterwards.
func TestEngineSeeds(t *testing.T) {
	rig := newFuzzRig(t)
	defer rig.dev.Close()
	seeds := engineSeeds(t)
	for _, s := range seeds[:len(seeds)-1] {
		for _, crc := range []bool{true, false} {
			rig.run(t, s, crc)
		}
	}
	for _, crc := range []bool{true, false} {
		inspected := false
		rig.inspect = func(t testing.TB) {
			inspected = true
			if got := string(rig.w.buf[16:20]); got != "data" {
				t.Errorf("RDMA Write placed %q, want %q", got, "data")
			}
			if got := string(rig.recv.buf[:5]); got != "hello" {
				t.Errorf("Send placed %q, want %q", got, "hello")
			}
			if got := binary.NativeEndian.Uint64(rig.a.buf[8:]); got != 1 { // host order (atomic.go)
				t.Errorf("Fetch-and-Add left %d, want 1", got)
			}
			if info, err := rig.w.mr.Query(); err != nil || info.Valid {
				t.Errorf("Send with Invalidate left the region valid (%+v, %v)", info, err)
			}
		}
		rig.run(t, seeds[len(seeds)-1], crc)
		rig.inspect = nil
		if !inspected {
			t.Fatal("the stream's results were not inspected")
		}
		for _, m := range []*fuzzMR{&rig.w, &rig.r, &rig.a, &rig.g, &rig.recv} {
			if info, err := m.mr.Query(); err != nil || !info.Valid {
				t.Fatalf("region %#x not valid again after the input (%+v, %v)", m.mr.STag(), info, err)
			}
		}
		if rig.w.buf[16] != 0 {
			t.Fatal("region not zeroed after the input")
		}
	}
}
