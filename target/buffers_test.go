package target

import (
	"bytes"
	"context"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/store"
)

// connOf returns the first QP of the target's session on volume vol.
func (r *rig) connOf(vol string) *conn {
	r.t.Helper()
	var c *conn
	r.waitFor("a session on "+vol, func() bool {
		r.tgt.mu.Lock()
		defer r.tgt.mu.Unlock()
		for _, s := range r.tgt.sessions {
			if s.vol.name != vol {
				continue
			}
			s.mu.Lock()
			if len(s.qps) > 0 {
				c = s.qps[0]
			}
			s.mu.Unlock()
		}
		return c != nil
	})
	return c
}

// TestWriteBuffersStartClean: the buffers the target advertises for
// remote writes, a WRITE_REQ's buffer and the write grants, come from the
// pool that READ buffers return to, so they hold what their last user left
// there: here another session's READ of another volume, which an initiator
// could read back from its own volume if a WRITE stored bytes it did not
// write. The target stores only bytes the initiator placed since the
// buffer was registered (rnic.MR.Placed): a WRITE whose data was not
// placed in full, in order from the buffer's start, is refused with
// StatusInvalid and stores nothing; one written in full is stored.
func TestWriteBuffersStartClean(t *testing.T) {
	const n = 64 << 10 // the READ buffer's pool class, the grant size
	secret := pattern(n, 0x5A)
	setup := func(t *testing.T) (*rig, func(), store.Volume) {
		r := newRig(t, nil)
		ctx := context.Background()
		if _, err := r.st.CreateVolume(ctx, "vol1", volSize, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		vol1, err := r.st.OpenVolume(ctx, "vol1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { vol1.Close() })
		r.fill(0, secret)
		victim := r.dialVolume(4, 0, "vol0")
		vc := r.connOf("vol0")
		// leak has the victim READ vol0's secret through a pooled buffer
		// and RELEASE it: the buffer goes back to the pool.
		leak := func() {
			b := victim.ready(blockproto.OpRead, 0, n, 0)
			victim.command(blockproto.CommandFields{Op: blockproto.OpRelease, STag: b.STag}, 0, true)
			r.waitFor("the victim's READ buffer released", func() bool { return stateOf(vc, 0) == slotFree })
		}
		return r, leak, vol1
	}
	// check reads vol1's first blocks*n bytes: want[i] is what piece i
	// must hold (nil: zeros, never written).
	check := func(t *testing.T, vol1 store.Volume, want [][]byte) {
		t.Helper()
		got := make([]byte, len(want)*n)
		if err := vol1.ReadBlocks(context.Background(), 0, got); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			part := got[i*n : (i+1)*n]
			if bytes.Equal(part, secret) {
				t.Fatalf("vol1 at %d holds vol0's data, read by another session: the WRITE stored a stale pool buffer", i*n)
			}
			if w == nil {
				w = make([]byte, n)
			}
			if !bytes.Equal(part, w) {
				t.Fatalf("vol1 at %d does not hold what the initiator wrote there (or zeros where it wrote nothing)", i*n)
			}
		}
	}
	written := pattern(n, 0x33)
	// writeAs writes what of written the case places (none, its first
	// half, all of it) into stag at TO 0.
	writeAs := func(p *peer, stag uint32, placed int) {
		if placed > 0 {
			p.rdmaWrite(stag, 0, written[:placed])
		}
	}
	cases := []struct {
		name   string
		placed int
	}{{"nothing placed", 0}, {"half placed", n / 2}, {"all placed", n}}

	for _, c := range cases {
		t.Run("WRITE_REQ buffer, "+c.name, func(t *testing.T) {
			r, leak, vol1 := setup(t)
			p := r.dialVolume(4, 0, "vol1") // its grants are taken before the leak
			leak()
			b := p.ready(blockproto.OpWriteReq, 0, n, 0)
			writeAs(p, b.STag, c.placed)
			tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: 0, Length: n, STag: b.STag}, 0, true)
			resp := p.response(tag)
			if c.placed < n {
				if resp.Status() != blockproto.StatusInvalid {
					t.Fatalf("WRITE with %d of %d bytes placed: %s %q, want %s", c.placed, n, resp.Status(), resp.Detail(),
						blockproto.StatusInvalid)
				}
				check(t, vol1, [][]byte{nil})
				return
			}
			if resp.Status() != blockproto.StatusOK {
				t.Fatalf("WRITE: %s %s", resp.Status(), resp.Detail())
			}
			check(t, vol1, [][]byte{written})
		})

		t.Run("write grant, "+c.name, func(t *testing.T) {
			r, leak, vol1 := setup(t)
			leak()
			p := r.dialVolume(4, 0, "vol1") // its grants come from the pool after the leak
			want := make([][]byte, len(p.w.Grants))
			for i, g := range p.w.Grants {
				writeAs(p, g.STag, c.placed)
				tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: uint64(i * n), Length: n, STag: g.STag},
					uint16(i), true)
				resp := p.response(tag)
				if c.placed < n {
					if resp.Status() != blockproto.StatusInvalid {
						t.Fatalf("WRITE through grant %d with %d of %d bytes placed: %s %q, want %s", i, c.placed, n,
							resp.Status(), resp.Detail(), blockproto.StatusInvalid)
					}
					continue
				}
				if resp.Status() != blockproto.StatusOK {
					t.Fatalf("WRITE through grant %d: %s %s", i, resp.Status(), resp.Detail())
				}
				want[i] = written
			}
			check(t, vol1, want)
		})
	}
}
