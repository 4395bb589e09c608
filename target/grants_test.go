package target

import (
	"bytes"
	"context"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// grantStates counts the table's grants: advertised and idle.
func grantStates(gt *grantTable) (out, idle, all int) {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	for _, g := range gt.all {
		if g.out {
			out++
		}
	}
	return out, len(gt.idle), len(gt.all)
}

// TestGrantsWelcome: the WELCOME advertises one grant per credit (up to
// MaxGrants and the 16 a WELCOME holds), each its own remote-write STag
// over GrantSize bytes.
func TestGrantsWelcome(t *testing.T) {
	for _, tc := range []struct{ credits, maxGrants, want int }{
		{4, 0, 4},
		{8, 3, 3},
		{32, 0, blockproto.MaxWelcomeGrants},
	} {
		r := newRig(t, func(c *Config) { c.MaxGrants = tc.maxGrants })
		p := r.dial(tc.credits, 0)
		if len(p.w.Grants) != tc.want {
			t.Fatalf("credits %d, MaxGrants %d: %d grants in the WELCOME, want %d", tc.credits, tc.maxGrants,
				len(p.w.Grants), tc.want)
		}
		seen := map[uint32]bool{}
		for _, g := range p.w.Grants {
			if seen[g.STag] || g.Len != uint32(r.tgt.cfg.GrantSize) {
				t.Fatalf("grant %+v: duplicate or not GrantSize (%d)", g, r.tgt.cfg.GrantSize)
			}
			seen[g.STag] = true
		}
		out, idle, all := grantStates(&r.conn0().grants)
		if out != tc.want || out+idle != all {
			t.Fatalf("grant table: %d out, %d idle of %d; want %d out", out, idle, all, tc.want)
		}
	}
}

// TestGrantsBudget: grants take at most half of BufferBytes, so READs and
// WRITE_REQs always find memory; the session's end gives the bytes back.
func TestGrantsBudget(t *testing.T) {
	const grant, maxXfer = 64 << 10, 256 << 10
	r := newRig(t, func(c *Config) {
		c.GrantSize, c.MaxTransfer = grant, maxXfer
		c.BufferBytes = 2*maxXfer + 2*blk // half: room for 4 grants
	})
	p := r.dial(8, 0)
	if len(p.w.Grants) != 4 {
		t.Fatalf("%d grants, want the 4 that fit half the buffer budget", len(p.w.Grants))
	}
	if got := r.tgt.grantBytes.Load(); got != 4*grant {
		t.Fatalf("grant bytes %d, want %d", got, 4*grant)
	}
	// A READ of the largest transfer still finds its buffer.
	b := p.ready(blockproto.OpRead, 0, maxXfer, 0)
	if wc := p.rdmaRead(b.STag, b.TO, maxXfer); wc.Status != rnic.StatusSuccess {
		t.Fatalf("RDMA Read: %v", wc.Err())
	}
	p.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 0, true)
	p.ep.Close(nil)
	r.waitFor("the session to end", r.noSession)
	if got := r.tgt.grantBytes.Load(); got != 0 {
		t.Fatalf("grant bytes %d after the session ended, want 0", got)
	}
}

// TestGrantsCycle: a WRITE through a grant consumes it (its Send with
// Invalidate revokes the STag), the RESPONSE advertises a grant again
// under a fresh key, and the consumed STag no longer accepts data.
func TestGrantsCycle(t *testing.T) {
	r := newRig(t, nil)
	p := r.dial(4, 0)
	c := r.conn0()
	g := p.w.Grants[0]
	data := pattern(8192, 5)
	p.rdmaWrite(g.STag, g.TO, data)
	tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: 64 << 10, Length: 8192, STag: g.STag}, 1, true)
	resp := p.response(tag)
	if resp.Status() != blockproto.StatusOK {
		t.Fatalf("WRITE: %s %s", resp.Status(), resp.Detail())
	}
	ng := resp.Grant().Fields()
	if ng.STag == 0 || ng.STag == g.STag {
		t.Fatalf("the RESPONSE's grant %#x: want a fresh STag, not 0 or the consumed %#x", ng.STag, g.STag)
	}
	if rnic.STag(ng.STag).Index() == rnic.STag(g.STag).Index() && rnic.STag(ng.STag).Key() == rnic.STag(g.STag).Key() {
		t.Fatal("the grant came back under the same key")
	}
	out, idle, all := grantStates(&c.grants)
	if out != all || idle != 0 {
		t.Fatalf("grant table after the cycle: %d out, %d idle of %d; want all out", out, idle, all)
	}
	got := make([]byte, 8192)
	if err := r.vol.ReadBlocks(context.Background(), 16, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the store does not hold the granted write")
	}
	if c.grants.consume(rnic.STag(g.STag)) != nil {
		t.Fatal("the consumed grant's STag is still outstanding in the table")
	}
	// The old STag was invalidated by the WRITE: data aimed at it ends
	// the session and reaches nothing.
	p.rdmaWrite(g.STag, g.TO, pattern(4096, 0xEE))
	r.waitFor("the session to end", r.noSession)
	if err := r.vol.ReadBlocks(context.Background(), 16, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("a write through a consumed grant changed the volume")
	}
}
