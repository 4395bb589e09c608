package target

import (
	"sync"

	"github.com/rnic-dev/rnic/rnic"
)

// grant is a write grant: a buffer of GrantSize bytes and an STag of the
// QP's protection domain that is fast-registered over it, remote-write
// only and with a fresh key, each time it is advertised. A WRITE's Send
// with Invalidate revokes it; the buffer then belongs to the target until
// the grant is advertised again.
type grant struct {
	mr    *rnic.MR
	buf   []byte
	stag  rnic.STag // as last advertised
	out   bool      // advertised and not yet consumed
	pages [1][]byte
}

// grantTable holds a QP's grants.
type grantTable struct {
	mu      sync.Mutex
	all     []*grant
	byIndex map[uint32]*grant // by STag index
	idle    []*grant          // not advertised (never, or consumed)
	bytes   int64             // buffer bytes counted in Target.grantBytes
}

// setup allocates up to n grants of size bytes on c within the target's
// grant budget (half the buffer budget).
func (gt *grantTable) setup(c *conn, n, size int) error {
	t := c.t
	gt.byIndex = make(map[uint32]*grant, n)
	limit := t.cfg.BufferBytes / 2
	for i := 0; i < n; i++ {
		if t.grantBytes.Add(int64(size)) > limit {
			t.grantBytes.Add(-int64(size))
			break
		}
		buf := t.pool.TryGet(size)
		if buf == nil {
			t.grantBytes.Add(-int64(size))
			break
		}
		gt.bytes += int64(size)
		mr, err := c.AllocSTag(true)
		if err != nil {
			t.pool.Put(buf)
			return err
		}
		g := &grant{mr: mr, buf: buf[:size]}
		g.pages[0] = g.buf
		gt.all = append(gt.all, g)
		gt.byIndex[mr.STag().Index()] = g
		gt.idle = append(gt.idle, g)
	}
	return nil
}

// next takes an idle grant to advertise, or nil.
func (gt *grantTable) next() *grant {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	n := len(gt.idle)
	if n == 0 {
		return nil
	}
	g := gt.idle[n-1]
	gt.idle = gt.idle[:n-1]
	return g
}

// advertise records that g is out under stag.
func (gt *grantTable) advertise(g *grant, stag rnic.STag) {
	gt.mu.Lock()
	g.stag, g.out = stag, true
	gt.mu.Unlock()
}

// consume takes the outstanding grant advertised as stag (nil if none).
func (gt *grantTable) consume(stag rnic.STag) *grant {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	g := gt.byIndex[stag.Index()]
	if g == nil || !g.out || g.stag != stag {
		return nil
	}
	g.out = false
	return g
}

// putIdle returns a consumed grant for re-advertising.
func (gt *grantTable) putIdle(g *grant) {
	gt.mu.Lock()
	gt.idle = append(gt.idle, g)
	gt.mu.Unlock()
}

// count is the number of grants the table holds (0 once released).
func (gt *grantTable) count() int {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	return len(gt.all)
}

// release returns every grant's buffer (the engine no longer uses them;
// the endpoint frees their STags).
func (gt *grantTable) release(t *Target) {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	for _, g := range gt.all {
		t.pool.Put(g.buf)
	}
	t.grantBytes.Add(-gt.bytes)
	gt.all, gt.idle, gt.byIndex, gt.bytes = nil, nil, nil, 0
}

// freshKey returns a random STag key different from old's.
func freshKey(d *rnic.Device, old rnic.STag) uint8 {
	for {
		if k := d.RandomKey(); k != old.Key() {
			return k
		}
	}
}
