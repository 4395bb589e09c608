package nvmf

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// controller is one association of a host with a subsystem: created by an
// admin queue's Connect (dynamic controller model: any free ID), joined by
// the host's I/O queues, ended when its admin queue goes, when the host
// stops talking for longer than the keep alive timeout, or at shutdown.
// An NVM controller holds its volume through a target.FrontendSession (a
// reservation slot in the volume's lock table); a discovery controller
// holds nothing.
type controller struct {
	s       *Server
	id      uint16
	disc    bool
	subNQN  string
	hostNQN string
	hostID  [16]byte
	remote  net.Addr // the admin queue's peer
	local   string   // where the host reached us, "host:port"

	// NVM controllers only.
	fe     *target.FrontendSession
	volume store.VolumeInfo
	// blocks is the namespace's size in blocks as last read from the store
	// handle: a volume may grow while open (never shrink), so a range
	// past it is checked again against the handle's size (checkRange), and
	// Identify Namespace reads it afresh.
	blocks   atomic.Uint64
	inMemory bool
	nguid    [16]byte
	serial   string

	// activity counts the commands of all the controller's queues (the
	// keep alive timer looks for a change); rdy mirrors CSTS.RDY (and not
	// ended) for the I/O path.
	activity atomic.Uint64
	rdy      atomic.Bool

	// SMART counters: the host's reads and writes on this controller.
	reads, writes, bytesRead, bytesWritten atomic.Uint64

	mu         sync.Mutex
	cc, csts   uint32
	queues     map[uint16]*queue
	ioQueues   int // I/O queues granted (Set Features Number of Queues); 0: not asked
	aec        uint32
	aers       int    // Asynchronous Event Requests held
	tempOver   uint16 // composite temperature's over-temperature threshold (kelvins)
	tempUnder  uint16 // ... and its under-temperature threshold (0: none)
	kato       time.Duration
	connKATO   time.Duration // the keep alive timeout of Connect: the feature's default
	kaTimer    *time.Timer
	kaSeen     uint64 // activity when the timer period began
	kaArmed    uint64 // armings of the timer: a callback of an older one does nothing
	resvKey    uint64
	registered bool
	resvGen    uint32
	ended      bool
	endOnce    sync.Once
}

// Controller register bits (NVMe Base 2.0 §3.1.3).
const (
	ccEnable    = 1 << 0
	ccShnMask   = 3 << 14
	cstsReady   = 1 << 0
	cstsFatal   = 1 << 1
	cstsShstOcc = 1 << 2 // shutdown processing occurring
	cstsShstCmp = 2 << 2 // shutdown processing complete
	cstsShstMsk = 3 << 2
)

// Property offsets.
const (
	propCAP  = 0x00
	propVS   = 0x08
	propCC   = 0x14
	propCSTS = 0x1c
)

// nvmeVersion is the NVMe version the controllers implement (1.3: CNS 3
// is supported, which Linux requires from 1.3 on).
const nvmeVersion = 0x00010300

// newNVMController makes the controller of a volume's subsystem.
func (s *Server) newNVMController(fe *target.FrontendSession, subNQN, hostNQN string, hostID [16]byte, q *queue) *controller {
	c := s.newController(subNQN, hostNQN, hostID, q)
	c.fe = fe
	c.volume = fe.Info()
	// The handle's size, not the Info of when the volume was opened: it
	// may have grown since, while another session kept it open.
	c.blocks.Store(fe.Volume().Info().Blocks())
	c.inMemory = fe.Volume().InMemory()
	// Namespace IDs are globally unique and stable: a hash of the NQN, the
	// volume's store ID and its creation time (a volume deleted and created
	// again under the same name gets new ones).
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(c.volume.Created.UnixNano()))
	h := sha256.Sum256(append(append([]byte(subNQN), byte(c.volume.ID), byte(c.volume.ID>>8), byte(c.volume.ID>>16),
		byte(c.volume.ID>>24)), b[:]...))
	copy(c.nguid[:], h[:16])
	c.serial = hex.EncodeToString(h[16:26])
	return c
}

func (s *Server) newController(subNQN, hostNQN string, hostID [16]byte, q *queue) *controller {
	c := &controller{s: s, subNQN: subNQN, hostNQN: hostNQN, hostID: hostID, remote: q.remote, local: q.local,
		queues: map[uint16]*queue{}, tempOver: tempOverDefault}
	c.touch()
	return c
}

// namespaceBlocks reads the volume's size from its store handle (which
// follows a grow made while it is open) into c.blocks and returns it.
func (c *controller) namespaceBlocks() uint64 {
	n := c.fe.Volume().Info().Blocks()
	c.blocks.Store(n)
	return n
}

// touch records activity from the host (any command on any queue counts
// for the keep alive timer).
func (c *controller) touch() { c.activity.Add(1) }

// ready reports CSTS.RDY (false once the controller ended).
func (c *controller) ready() bool { return c.rdy.Load() }

// setCSTSLocked changes CSTS and its mirror. c.mu held.
func (c *controller) setCSTSLocked(v uint32) {
	c.csts = v
	c.rdy.Store(v&cstsReady != 0 && !c.ended)
}

// addQueue joins an I/O queue; false if the qid is taken or out of range.
func (c *controller) addQueue(q *queue) (ok bool, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.s.cfg.IOQueues
	if c.ioQueues > 0 {
		limit = c.ioQueues
	}
	switch {
	case c.ended:
		return false, "controller ended"
	case int(q.qid) > limit:
		return false, "qid above the I/O queues granted"
	case c.queues[q.qid] != nil:
		return false, "qid already connected"
	}
	c.queues[q.qid] = q
	return true, ""
}

// queueGone is told by a queue that ended. The admin queue takes the
// controller with it.
func (c *controller) queueGone(q *queue, reason string) {
	c.mu.Lock()
	if c.queues[q.qid] == q {
		delete(c.queues, q.qid)
	}
	ended := c.ended
	c.mu.Unlock()
	if q.qid == 0 && !ended {
		go c.end("admin queue ended: " + reason)
		return
	}
	c.s.log.Debug("queue ended", "cntlid", c.id, "qid", q.qid, "reason", reason)
}

// end drops the controller: its keep alive timer, every queue, its hold
// on the volume (releasing a reservation it held).
func (c *controller) end(reason string) {
	c.endOnce.Do(func() {
		c.mu.Lock()
		c.ended = true
		c.rdy.Store(false)
		if c.kaTimer != nil {
			c.kaTimer.Stop()
		}
		qs := make([]*queue, 0, len(c.queues))
		for _, q := range c.queues {
			qs = append(qs, q)
		}
		c.mu.Unlock()
		var wg sync.WaitGroup
		for _, q := range qs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q.end("controller ended: " + reason)
			}()
		}
		wg.Wait()
		c.s.removeController(c)
		if c.fe != nil {
			c.fe.End("nvmf controller ended: " + reason)
		}
		c.s.m.Controllers.Add(-1)
		c.s.log.Info("controller ended", "cntlid", c.id, "subnqn", c.subNQN, "hostnqn", c.hostNQN, "reason", reason)
	})
}

// property returns a property's value (Property Get).
func (c *controller) property(off uint32, size8 bool) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size8 {
		if off != propCAP {
			return 0, fail(StatusInvalidField, "8-byte property at 0x%x", off)
		}
		return c.capability(), nil
	}
	switch off {
	case propVS:
		return nvmeVersion, nil
	case propCC:
		return uint64(c.cc), nil
	case propCSTS:
		return uint64(c.csts), nil
	}
	return 0, fail(StatusInvalidField, "4-byte property at 0x%x", off)
}

// capability is CAP: MQES (0-based), CQR, TO (500 ms units), CSS bit 37
// (the NVM command set), MPSMIN = MPSMAX = 4 KiB.
func (c *controller) capability() uint64 {
	mqes := uint64(MaxQueueSize - 1)
	if c.disc {
		mqes = AdminQueueSize - 1
	}
	return mqes | 1<<16 | 15<<24 | 1<<37
}

// setCC applies a write of CC (Property Set): enabling checks the queue
// entry sizes, page size, arbitration and command set the host chose;
// clearing EN resets the controller; a shutdown notification flushes the
// volume before CSTS says the shutdown is complete. It reports whether a
// shutdown began; the caller then runs shutdown.
func (c *controller) setCC(v uint32) (shutdown bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cc
	c.cc = v
	if v&ccEnable != 0 && old&ccEnable == 0 {
		iosqes, iocqes := v>>16&0xf, v>>20&0xf
		mps, ams, css := v>>7&0xf, v>>11&7, v>>4&7
		if (!c.disc && (iosqes != 6 || iocqes != 4)) || mps != 0 || ams != 0 || css != 0 {
			c.setCSTSLocked(c.csts | cstsFatal)
			c.s.log.Warn("controller enable with unsupported settings", "cntlid", c.id, "cc", v)
		} else {
			c.setCSTSLocked(c.csts&^cstsShstMsk | cstsReady)
		}
	}
	if v&ccEnable == 0 && old&ccEnable != 0 {
		c.setCSTSLocked(c.csts &^ (cstsReady | cstsFatal))
	}
	if v&ccShnMask != 0 && old&ccShnMask == 0 {
		c.setCSTSLocked(c.csts&^cstsShstMsk | cstsShstOcc)
		return true
	}
	return false
}

// shutdown completes a shutdown notification: the volume's writes are made
// durable, then CSTS.SHST says complete.
func (c *controller) shutdown(ctx context.Context) error {
	var err error
	if c.fe != nil {
		err = c.fe.Volume().Flush(ctx)
	}
	c.mu.Lock()
	c.setCSTSLocked(c.csts&^cstsShstMsk | cstsShstCmp)
	c.mu.Unlock()
	return err
}

// hasIOQueueLocked reports whether an I/O queue (any but the admin queue,
// QID 0) is connected. c.mu held.
func (c *controller) hasIOQueueLocked() bool {
	for qid := range c.queues {
		if qid != 0 {
			return true
		}
	}
	return false
}
