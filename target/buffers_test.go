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
// pool that READ buffers return to. A WRITE stores the whole buffer
// whether or not the initiator RDMA-Wrote all of it, so bytes it did not
// write must not be what the buffer last held: here another session's
// READ of another volume, which the initiator could then read back from
// its own volume. What an initiator did not write reads as zeros.
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
	check := func(t *testing.T, vol1 store.Volume, blocks int) {
		got := make([]byte, blocks*n)
		if err := vol1.ReadBlocks(context.Background(), 0, got); err != nil {
			t.Fatal(err)
		}
		for i := range blocks {
			part := got[i*n : (i+1)*n]
			if bytes.Equal(part, secret) {
				t.Fatalf("vol1 at %d holds vol0's data, read by another session: the WRITE stored a stale pool buffer", i*n)
			}
			if !bytes.Equal(part, make([]byte, n)) {
				t.Fatalf("vol1 at %d: bytes the initiator never wrote are not zeros", i*n)
			}
		}
	}

	t.Run("WRITE_REQ buffer", func(t *testing.T) {
		r, leak, vol1 := setup(t)
		p := r.dialVolume(4, 0, "vol1") // its grants are taken before the leak
		leak()
		b := p.ready(blockproto.OpWriteReq, 0, n, 0)
		// No RDMA Write: the WRITE names the buffer as it is.
		tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: 0, Length: n, STag: b.STag}, 0, true)
		if resp := p.response(tag); resp.Status() != blockproto.StatusOK {
			t.Fatalf("WRITE: %s %s", resp.Status(), resp.Detail())
		}
		check(t, vol1, 1)
	})

	t.Run("write grant", func(t *testing.T) {
		r, leak, vol1 := setup(t)
		leak()
		p := r.dialVolume(4, 0, "vol1") // its grants come from the pool after the leak
		for i, g := range p.w.Grants {
			tag := p.command(blockproto.CommandFields{Op: blockproto.OpWrite, Offset: uint64(i * n), Length: n, STag: g.STag},
				uint16(i), true)
			if resp := p.response(tag); resp.Status() != blockproto.StatusOK {
				t.Fatalf("WRITE through grant %d: %s %s", i, resp.Status(), resp.Detail())
			}
		}
		check(t, vol1, len(p.w.Grants))
	})
}
