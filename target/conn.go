package target

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/internal/endpoint"
	"github.com/rnic-dev/rnic/rnic"
)

// conn is one QP of a session (or of a login in progress) with everything
// it owns: its endpoint (a protection domain of its own, so no STag
// registered for it is usable from any other QP; one CQ; the receive
// buffers and the send areas), the slots and their workers, the write
// grants, the inline DATA areas, its registration of the volume's lock
// table.
type conn struct {
	*endpoint.Endpoint
	t    *Target
	log  *slog.Logger
	sess *session
	// inSession is set once the session holds the QP (addQP): from then
	// on the session, not the login, tears it down.
	inSession atomic.Bool

	credits int // slots granted at login (0 while logging in)
	// afterFree, if set (tests only), runs in finish between the freeing
	// of a slot and the post of its answer.
	afterFree atomic.Pointer[func(*slot)]
	lockMR    *rnic.MR
	// inline is the largest READ answered with DATA (0: the QP has no
	// inline reads); inBuf holds one DATA area of inArea bytes per slot.
	inline int
	// extents: the LOGIN asked for BLOCK_STATUS, and the WELCOME granted it.
	extents bool
	// noHole: the LOGIN asked for WRITE_ZEROES with FlagNoHole, and the
	// WELCOME granted it.
	noHole bool
	inArea int
	inBuf  []byte
	inMR   *rnic.MR

	slots  []slot
	grants grantTable

	dead     chan struct{} // closed when the QP is known to be going away
	deadOnce sync.Once
	byeDone  chan struct{} // closed when the GOODBYE Send completed
	byeOnce  sync.Once

	workers sync.WaitGroup
}

// Work request IDs of the target's send queue.
const (
	wrGoodbye = 1<<62 + iota
	wrLogin   // the signaled REJECT
)

// Send areas: one per slot (its answers), then the login area and the
// GOODBYE area.
func (c *conn) loginArea() int { return c.t.cfg.MaxCredits }
func (c *conn) byeArea() int   { return c.t.cfg.MaxCredits + 1 }

// rejectArea holds a login's REJECT: the first slot's area, which no
// answer uses before the session starts. Not the login area, whose
// CHALLENGE went out unsignaled: an initiator that sends its PROOF
// without waiting for the CHALLENGE (a replay, a prober) gets its REJECT
// while that Send may still be reading the login area, and a REJECT
// written there would go out in the CHALLENGE's place, cut to its length.
func (c *conn) rejectArea() int { return 0 }

// newConn allocates a QP sized for cfg.MaxCredits, with two receives
// posted for LOGIN and PROOF.
func (t *Target) newConn() (*conn, error) {
	cfg := t.cfg
	rq := 2 * cfg.MaxCredits
	ep, err := endpoint.New(endpoint.Config{Device: t.dev,
		QP: rnic.QPConfig{SQDepth: 4*cfg.MaxCredits + 8, IRD: cfg.IRD, ORD: 1, InboundRead: true, InboundWrite: true,
			InboundAtomic: true, Privileged: true},
		Receives: rq, RecvSize: blockproto.MaxMessage, Posted: 2,
		SendAreas: cfg.MaxCredits + 2, SendSize: blockproto.MaxMessage,
		// The handler runs in-memory work itself and hands the rest
		// to the slots' workers: it never blocks.
		Direct: true})
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	return &conn{Endpoint: ep, t: t, log: t.log, dead: make(chan struct{}), byeDone: make(chan struct{})}, nil
}

// setupInline gives the QP inline reads of up to n bytes: one registered
// DATA area per slot.
func (c *conn) setupInline(n int) error {
	c.inArea = blockproto.DataLen(n)
	c.inBuf = make([]byte, c.credits*c.inArea)
	mr, err := c.Register(c.inBuf, rnic.LocalRead|rnic.LocalWrite)
	if err != nil {
		return fmt.Errorf("target: register inline send buffers: %w", err)
	}
	c.inMR, c.inline = mr, n
	return nil
}

// dataArea returns slot i's DATA area and dataSGE the SGE naming its first
// n bytes.
func (c *conn) dataArea(i int) []byte { return c.inBuf[i*c.inArea : (i+1)*c.inArea] }

func (c *conn) dataSGE(i, n int) rnic.SGE {
	return rnic.SGE{STag: c.inMR.STag(), TO: uint64(i * c.inArea), Len: uint32(n)}
}

// markDead records that the QP is going away.
func (c *conn) markDead() { c.deadOnce.Do(func() { close(c.dead) }) }

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// kill resets the connection (used for logins in progress at shutdown).
func (c *conn) kill() {
	c.markDead()
	c.Kill()
}

// handle processes a batch of completions (the endpoint's loop); false:
// the loop must stop.
func (c *conn) handle(wcs []rnic.WC) bool {
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != rnic.StatusSuccess {
			if !c.isDead() && wc.Status != rnic.StatusFlushed {
				c.log.Info("work request failed: ending session", "qp", c.QP.ID(), "err", wc.Err())
			}
			c.lost()
			return false
		}
		if wc.Op == rnic.WRRecv {
			if err := c.onRecv(wc); err != nil {
				c.protocolError(err)
				return false
			}
		} else if wc.ID == wrGoodbye {
			c.byeOnce.Do(func() { close(c.byeDone) })
		}
	}
	return true
}

// lost ends the session because this QP's connection is gone.
func (c *conn) lost() {
	c.markDead()
	if c.sess.closing.Load() {
		// The target is closing the session itself (goodbye), which
		// ends it once every QP has said goodbye: ending it here, as the
		// first QP closes, would reset the others mid-goodbye.
		return
	}
	reason := "connection lost"
	if st := c.QP.State(); st == rnic.StateIdle || st == rnic.StateClosing {
		// An orderly close: FIN both ways (Idle), or the initiator's
		// FIN seen, with ours on its way (Closing: the receives are
		// flushed as the QP enters it, so the handler may see the
		// flush before Idle).
		reason = reasonInitiatorClosed
	}
	go c.sess.end(reason)
}

// protocolError ends the session for a peer's protocol violation.
func (c *conn) protocolError(err error) {
	c.t.m.ProtocolErrors.Add(1)
	c.log.Warn("protocol violation: ending session", "qp", c.QP.ID(), "session", c.sess.id, "err", err)
	c.markDead()
	go c.sess.end("protocol violation")
}

// down tears the QP down (endpoint.Close): the connection is reset, the
// engine is done with every buffer, the loop and the workers stop, and
// the slots, grants and registrations are freed. Safe to call more than
// once.
func (c *conn) down() {
	c.markDead()
	err := c.Close(func() {
		c.workers.Wait()
		// onRecv counts a command (begin) before it wakes the slot's
		// worker; a worker that saw the endpoint stop first left without
		// it, and without this the count never drops and Shutdown waits
		// forever.
		for i := range c.slots {
			select {
			case <-c.slots[i].wake:
				c.t.end()
			default:
			}
		}
		for i := range c.slots {
			c.slots[i].release()
		}
		c.grants.release(c.t)
	})
	if err != nil {
		c.log.Warn("releasing QP resources", "err", err)
	}
}

// sayGoodbye sends GOODBYE (signaled; Value 1 if every acknowledged
// write is durable) and waits for its completion, then closes the
// connection gracefully.
func (c *conn) sayGoodbye(ctx context.Context, synced bool, detail string) {
	if c.isDead() {
		return
	}
	a := c.byeArea()
	m, err := blockproto.EncodeResponse(c.Area(a), &blockproto.ResponseFields{Op: blockproto.OpGoodbye,
		Status: blockproto.StatusShutdown, Value: goodbyeValue(synced), Detail: detail})
	if err != nil {
		return
	}
	if _, err := c.QP.PostSend(rnic.SendWR{ID: wrGoodbye, Op: rnic.WRSend, SGL: []rnic.SGE{c.AreaSGE(a, len(m))}}); err != nil {
		return
	}
	select {
	case <-c.byeDone:
	case <-c.dead:
	case <-ctx.Done():
	}
	if c.QP.State() == rnic.StateRTS {
		c.QP.Modify(rnic.StateClosing, rnic.ModifyAttrs{})
	}
}

func goodbyeValue(synced bool) uint64 {
	if synced {
		return blockproto.GoodbyeSynced
	}
	return 0
}
