package target

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// conn0 returns the first QP of the target's session.
func (r *rig) conn0() *conn {
	s := r.session()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.qps[0]
}

// stateOf reads slot k's state under its lock.
func stateOf(c *conn, k int) slotState {
	s := &c.slots[k]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (r *rig) fill(off int64, b []byte) {
	r.t.Helper()
	if err := r.vol.WriteBlocks(context.Background(), uint64(off)/blk, b, false); err != nil {
		r.t.Fatal(err)
	}
}

// TestSlotRead walks a slot through a READ: busy, waiting for RELEASE with
// its buffer advertised, free again after the RELEASE, which revokes the
// buffer's STag.
func TestSlotRead(t *testing.T) {
	r := newRig(t, nil)
	data := pattern(64<<10, 3)
	r.fill(128<<10, data)
	p := r.dial(4, 0)
	c := r.conn0()
	inUse := r.tgt.pool.InUse()

	b := p.ready(blockproto.OpRead, 128<<10+512, 32<<10, 1)
	if st := stateOf(c, 1); st != slotAwaitRelease {
		t.Fatalf("slot 1 after READY: state %d, want slotAwaitRelease", st)
	}
	if st := stateOf(c, 0); st != slotFree {
		t.Fatalf("slot 0: state %d, want free", st)
	}
	if r.tgt.pool.InUse() <= inUse {
		t.Fatalf("the READ holds no pool buffer (in use %d, before %d)", r.tgt.pool.InUse(), inUse)
	}
	if b.Len != 32<<10 {
		t.Fatalf("READY of %d bytes, want %d", b.Len, 32<<10)
	}
	if wc := p.rdmaRead(b.STag, b.TO, int(b.Len)); wc.Status != rnic.StatusSuccess {
		t.Fatalf("RDMA Read of the READY buffer: %v", wc.Err())
	}
	if !bytes.Equal(p.sink[:b.Len], data[512:512+b.Len]) {
		t.Fatal("the READY buffer does not hold the volume's bytes")
	}
	p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 1, true)
	r.waitFor("slot 1 free after RELEASE", func() bool { return stateOf(c, 1) == slotFree })
	s := &c.slots[1]
	s.mu.Lock()
	buf, leaseRunning := s.buf, s.lease.Stop()
	s.mu.Unlock()
	if buf != nil || leaseRunning {
		t.Fatalf("after RELEASE: buffer %v, lease running %v; want neither", buf != nil, leaseRunning)
	}
	// The RELEASE invalidated the STag: reading it again is a protection
	// error, which ends the session.
	if wc := p.rdmaRead(b.STag, b.TO, int(b.Len)); wc.Status == rnic.StatusSuccess {
		t.Fatal("the released buffer's STag still reads")
	}
	r.waitFor("the session to end", r.noSession)
}

// TestSlotWriteReq walks a slot through a two-step write: READY naming a
// remote-write buffer, RDMA Write, WRITE with Invalidate of it, RESPONSE.
func TestSlotWriteReq(t *testing.T) {
	r := newRig(t, nil)
	p := r.dial(4, 0)
	c := r.conn0()
	data := pattern(12<<10, 9)
	const off = 1<<20 + 1024
	b := p.ready(blockproto.OpWriteReq, off, uint32(len(data)), 2)
	if st := stateOf(c, 2); st != slotAwaitWrite {
		t.Fatalf("slot 2 after READY: state %d, want slotAwaitWrite", st)
	}
	p.rdmaWrite(b.STag, b.TO, data)
	tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: off, Length: uint32(len(data)), STag: b.STag}, 2, true)
	if resp := p.response(tag); resp.Status() != blockproto.StatusOK {
		t.Fatalf("WRITE: %s %s", resp.Status(), resp.Detail())
	}
	if st := stateOf(c, 2); st != slotFree {
		t.Fatalf("slot 2 after the RESPONSE: state %d, want free", st)
	}
	got := make([]byte, 16<<10)
	if err := r.vol.ReadBlocks(context.Background(), (off / blk), got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[off%blk:off%blk+len(data)], data) {
		t.Fatal("the store does not hold the written bytes")
	}
	if m := r.tgt.m.TwoStepWrites.Load(); m != 1 {
		t.Fatalf("TwoStepWrites %d, want 1", m)
	}
}

// TestSlotMismatchedWrite: a WRITE that does not repeat its WRITE_REQ's
// range is refused with StatusInvalid, and nothing is stored.
func TestSlotMismatchedWrite(t *testing.T) {
	r := newRig(t, nil)
	p := r.dial(4, 0)
	b := p.ready(blockproto.OpWriteReq, 8192, 4096, 0)
	p.rdmaWrite(b.STag, b.TO, pattern(4096, 1))
	tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: 0, Length: 4096, STag: b.STag}, 0, true)
	if resp := p.response(tag); resp.Status() != blockproto.StatusInvalid {
		t.Fatalf("WRITE with another range: %s, want %s", resp.Status(), blockproto.StatusInvalid)
	}
	got := make([]byte, 3*4096)
	if err := r.vol.ReadBlocks(context.Background(), 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatal("a refused WRITE changed the volume")
	}
}

// TestSlotProtocolErrors: every way of breaking a slot's exchange ends the
// session as a protocol violation.
func TestSlotProtocolErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(p *peer)
	}{
		{"command on a busy slot", func(p *peer) {
			p.ready(blockproto.OpRead, 0, 64<<10, 0)
			p.command(blockproto.CommandFields{Op: blockproto.OpFlush}, 0, false)
		}},
		{"slot beyond the credits", func(p *peer) {
			p.command(blockproto.CommandFields{Op: blockproto.OpFlush}, 4, false)
		}},
		{"RELEASE as a plain Send", func(p *peer) {
			b := p.ready(blockproto.OpRead, 0, 64<<10, 0)
			p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 0, false)
		}},
		{"RELEASE on a free slot", func(p *peer) {
			p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: p.w.Grants[0].STag}, 1, true)
		}},
		{"RELEASE of another slot's buffer", func(p *peer) {
			p.ready(blockproto.OpRead, 0, 64<<10, 0)
			b := p.ready(blockproto.OpRead, 0, 64<<10, 1)
			p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 0, true)
		}},
		{"WRITE as a plain Send", func(p *peer) {
			g := p.w.Grants[0]
			p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Length: 4096, STag: g.STag}, 0, false)
		}},
		{"WRITE naming a READY buffer, not a grant", func(p *peer) {
			b := p.ready(blockproto.OpRead, 0, 64<<10, 0)
			p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Length: 4096, STag: b.STag}, 1, true)
		}},
		{"command sent with Invalidate", func(p *peer) {
			p.command(blockproto.CommandFields{Op: blockproto.OpFlush, STag: p.w.Grants[0].STag}, 0, true)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			p := r.dial(4, 0)
			r.session()
			tc.run(p)
			r.waitFor("the session to end", r.noSession)
			if n := r.tgt.m.ProtocolErrors.Load(); n != 1 {
				t.Fatalf("ProtocolErrors %d, want 1", n)
			}
		})
	}
}

// TestLeaseExpiry: a READY buffer not released within the lease has its
// STag revoked; the buffer itself stays with the slot (a Read Response
// may still be leaving it) until the RELEASE or teardown.
func TestLeaseExpiry(t *testing.T) {
	r := newRig(t, func(c *Config) { c.ReadLease = 20 * time.Millisecond })
	p := r.dial(4, 0)
	c := r.conn0()
	b := p.ready(blockproto.OpRead, 0, 64<<10, 3)
	r.waitFor("the lease to expire", func() bool { return r.tgt.m.LeaseExpired.Load() == 1 })
	s := &c.slots[3]
	s.mu.Lock()
	st, held := s.state, s.buf != nil
	s.mu.Unlock()
	if st != slotAwaitRelease || !held {
		t.Fatalf("after expiry: state %d, buffer held %v; want slotAwaitRelease with the buffer", st, held)
	}
	if wc := p.rdmaRead(b.STag, b.TO, int(b.Len)); wc.Status == rnic.StatusSuccess {
		t.Fatal("an expired buffer still reads")
	}
	r.waitFor("teardown to return the expired exchange's buffer", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.buf == nil
	})
}

// TestLeaseStaleTimer: a lease timer that fires before the deadline of
// the exchange now in the slot (it was armed for an earlier one) revokes
// nothing.
func TestLeaseStaleTimer(t *testing.T) {
	r := newRig(t, nil) // 30 s leases
	p := r.dial(4, 0)
	c := r.conn0()
	b := p.ready(blockproto.OpRead, 0, 8192, 0)
	c.slots[0].expire()
	if wc := p.rdmaRead(b.STag, b.TO, int(b.Len)); wc.Status != rnic.StatusSuccess {
		t.Fatalf("a stale lease timer revoked a live buffer: %v", wc.Err())
	}
	if n := r.tgt.m.LeaseExpired.Load(); n != 0 {
		t.Fatalf("LeaseExpired %d, want 0", n)
	}
	p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 0, true)
	r.waitFor("slot 0 free", func() bool { return stateOf(c, 0) == slotFree })
}

// TestReadHereThin: inline READs of whole blocks within one cluster of a
// thin volume, whose data the page cache holds or which is a hole, are
// answered by the completion handler; unaligned ones and ones across
// clusters by the slot's worker; the DATA holds the volume's bytes either
// way.
func TestReadHereThin(t *testing.T) {
	st, err := store.OpenThin(t.TempDir(), store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := newRigOn(t, st, nil)
	vol := make([]byte, 128<<10) // cluster 0 written, cluster 1 a hole
	for i := range 64 << 10 {
		vol[i] = byte(i*7 + i>>12)
	}
	if err := r.vol.WriteBlocks(context.Background(), 0, vol[:64<<10], false); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		off  uint64
		n    uint32
		here bool
	}{
		{0, 4096, true},
		{8192, 16384, true},
		{64 << 10, 4096, true},  // a hole
		{512, 1024, false},      // not whole blocks
		{60 << 10, 8192, false}, // across two clusters
	}
	p := r.dial(len(cases), 16<<10)
	for i, c := range cases {
		before := r.tgt.m.ReadsHere.Load()
		tag := p.command(blockproto.CommandFields{Op: blockproto.OpRead, Flags: blockproto.FlagInline,
			Offset: c.off, Length: c.n}, uint16(i), false)
		d, err := blockproto.ParseData(p.recv())
		if err != nil || d.Tag() != tag {
			t.Fatalf("READ of %d bytes at %d: expected its DATA: %v", c.n, c.off, err)
		}
		if !bytes.Equal(d.Payload(), vol[c.off:c.off+uint64(c.n)]) {
			t.Fatalf("READ of %d bytes at %d: the DATA differs from the volume", c.n, c.off)
		}
		if here := r.tgt.m.ReadsHere.Load() > before; here != c.here {
			t.Errorf("READ of %d bytes at %d: answered by the completion handler %v, want %v", c.n, c.off, here, c.here)
		}
	}
}

// TestWriteHereThin: granted WRITEs of whole blocks within one cluster of
// a thin volume, a cluster the volume alone holds or one never written,
// are written by the completion handler; FUA ones, unaligned ones, ones
// across clusters and ones into a cluster shared with a snapshot (a copy)
// by the slot's worker; the volume holds the data either way.
func TestWriteHereThin(t *testing.T) {
	st, err := store.OpenThin(t.TempDir(), store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := newRigOn(t, st, nil)
	if err := r.vol.WriteBlocks(context.Background(), 0, make([]byte, 64<<10), false); err != nil {
		t.Fatal(err) // cluster 0 allocated, cluster 1 not
	}
	cases := []struct {
		off  uint64
		n    uint32
		fua  bool
		snap bool // take a snapshot first
		here bool
	}{
		{0, 4096, false, false, true},
		{8192, 16384, false, false, true},
		{4096, 4096, true, false, false},      // FUA: waits for a commit
		{512, 1024, false, false, false},      // not whole blocks
		{68 << 10, 4096, false, false, true},  // allocates a cluster
		{60 << 10, 8192, false, false, false}, // across two clusters
		{0, 4096, false, true, false},         // shared with the snapshot: a copy
		{4096, 4096, false, false, true},      // the volume's own again
	}
	p := r.dial(4, 0)
	g := p.w.Grants[0]
	for i, c := range cases {
		data := pattern(int(c.n), byte(i+1))
		if c.snap {
			if _, err := st.CreateSnapshot(context.Background(), "vol0", fmt.Sprintf("s%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		before := r.tgt.m.WritesHere.Load()
		p.rdmaWrite(g.STag, g.TO, data)
		f := blockproto.CommandFields{Op: blockproto.OpWrite, Offset: c.off, Length: c.n, STag: g.STag}
		if c.fua {
			f.Flags = blockproto.FlagFUA
		}
		resp := p.response(p.command(f, 0, true))
		if resp.Status() != blockproto.StatusOK {
			t.Fatalf("WRITE of %d bytes at %d: %s %s", c.n, c.off, resp.Status(), resp.Detail())
		}
		g = resp.Grant().Fields()
		got := make([]byte, 128<<10)
		if err := r.vol.ReadBlocks(context.Background(), 0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[c.off:c.off+uint64(c.n)], data) {
			t.Fatalf("WRITE of %d bytes at %d: the volume does not hold the data", c.n, c.off)
		}
		if here := r.tgt.m.WritesHere.Load() > before; here != c.here {
			t.Errorf("WRITE of %d bytes at %d (FUA %v): written by the completion handler %v, want %v",
				c.n, c.off, c.fua, here, c.here)
		}
	}
}

// TestCommandBeforeAnswerSent: a slot is free before its answer is posted
// (an initiator may send the next command as soon as it has the answer,
// which can be before PostSend returns), so a hostile initiator can send
// the next command into that gap without waiting for the answer. Taken,
// it rewrote the slot's WRs while PostSend copied them, or the send area
// before the transmitter read it, and the first answer went out with the
// second's bytes. The test holds a FLUSH's answer between the freeing and
// the post until the early command was handled: it must be refused as a
// protocol violation, and nothing but the FLUSH's RESPONSE may reach the
// initiator. An inline READ answers in its DATA area; a granted WRITE in
// the same send area as the FLUSH (found by review).
func TestCommandBeforeAnswerSent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		early func(p *peer) // sends the early command on slot 0
	}{
		{"inline READ", func(p *peer) {
			p.command(blockproto.CommandFields{Op: blockproto.OpRead, Flags: blockproto.FlagInline, Offset: 8192, Length: 4096}, 0, false)
		}},
		{"granted WRITE", func(p *peer) {
			g := p.w.Grants[0]
			p.rdmaWrite(g.STag, g.TO, pattern(4096, 9))
			p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: 0, Length: 4096, STag: g.STag}, 0, true)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			p := r.dial(1, 4096)
			c := r.conn0()
			freed := make(chan struct{})
			var once bool
			hook := func(s *slot) {
				if once || s.idx != 0 {
					return
				}
				once = true // only the FLUSH's answer (its worker); the early command runs in the handler
				close(freed)
				r.waitFor("the early command handled", func() bool {
					return r.tgt.m.ProtocolErrors.Load() > 0 || stateOf(c, 0) == slotBusy
				})
				time.Sleep(50 * time.Millisecond)
			}
			c.afterFree.Store(&hook)
			flush := p.command(blockproto.CommandFields{Op: blockproto.OpFlush}, 0, false)
			<-freed
			tc.early(p)
			r.waitFor("the session to end", r.noSession)
			if n := r.tgt.m.ProtocolErrors.Load(); n != 1 {
				t.Fatalf("ProtocolErrors %d, want 1: the early command was taken", n)
			}
			for {
				wc := p.next()
				if wc.Status != rnic.StatusSuccess {
					break // the target reset the stream
				}
				if wc.Op != rnic.WRRecv {
					continue
				}
				msg := p.ep.Received(&wc)
				if rsp, err := blockproto.ParseResponse(msg); err != nil || rsp.Tag() != flush {
					t.Fatalf("the initiator got % x..., want only the FLUSH's RESPONSE (tag %#x)", msg[:min(len(msg), 16)], flush)
				}
			}
		})
	}
}
