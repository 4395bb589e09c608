package nvmf

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// Fabrics commands (opcode 0x7f, NVMe over Fabrics 1.1 §3.3): Connect,
// which makes a queue part of a controller, and Property Get/Set, the
// fabrics form of the controller registers (CAP, VS, CC, CSTS).
// Authentication (DH-HMAC-CHAP) is not offered: Connect's result never asks
// for it, and Authentication Send/Receive are refused as invalid opcodes.

// DiscoveryNQN is the well-known NQN of the discovery subsystem.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// Invalid-parameter pointers of a refused Connect (NVMe over Fabrics 1.1
// Figure 21): bit 16 says the offset is in the Connect data, else in the
// command.
const (
	ipoConnectData = 1 << 16
	ipoQID         = 42
	ipoSQSize      = 44
)

func invalidParam(ipo uint64, format string, a ...any) *StatusError {
	e := fail(StatusConnectInvalidParam, format, a...)
	e.Result = ipo
	return e
}

func (q *queue) fabrics(sl *slot, c Command) {
	switch c.FCType() {
	case FabricsConnect:
		q.connect(sl, c)
		return
	case FabricsPropertyGet, FabricsPropertySet:
	default:
		q.complete(sl, 0, fail(StatusInvalidOpcode, "fabrics command type 0x%02x", c.FCType()))
		return
	}
	ctrl := q.ctrl.Load()
	switch {
	case ctrl == nil:
		q.complete(sl, 0, fail(StatusCmdSeqError, "Property Get/Set before Connect"))
		return
	case q.qid != 0:
		q.complete(sl, 0, fail(StatusInvalidOpcode, "Property Get/Set on I/O queue %d", q.qid))
		return
	}
	if err := q.parseData(sl, 0); err != nil {
		q.complete(sl, 0, err)
		return
	}
	if c.FCType() == FabricsPropertyGet {
		v, err := ctrl.property(c.PropertyOffset(), c.PropertySize8())
		q.complete(sl, v, err)
		return
	}
	if c.PropertySize8() || c.PropertyOffset() != propCC {
		q.complete(sl, 0, fail(StatusInvalidField, "Property Set of %d bytes at 0x%x", map[bool]int{true: 8, false: 4}[c.PropertySize8()],
			c.PropertyOffset()))
		return
	}
	if !ctrl.setCC(uint32(c.PropertyValue())) {
		q.complete(sl, 0, nil)
		return
	}
	// A shutdown: the volume is flushed, off the poller, before the
	// completion (the host then reads CSTS.SHST = complete).
	q.run(sl, false, func(sl *slot) {
		ctx, cancel := context.WithTimeout(q.ctx, time.Minute)
		defer cancel()
		err := ctrl.shutdown(ctx)
		if err != nil {
			q.log.Error("flush at controller shutdown", "cntlid", ctrl.id, "err", err)
		}
		q.complete(sl, 0, nil)
	})
}

// connect checks a Connect command, reads its data, and binds the queue
// to a new controller (admin queue) or to the host's controller (I/O
// queue).
func (q *queue) connect(sl *slot, c Command) {
	refused := func(err error) {
		q.s.m.ConnectFailures.Add(1)
		q.log.Info("Connect refused", "err", err)
		q.complete(sl, 0, err)
	}
	// One Connect at a time: an admin queue's runs off the poller while
	// the volume opens, and a second one meanwhile would make a second
	// controller on the same queue that nothing ever ends.
	if q.ctrl.Load() != nil || !q.connecting.CompareAndSwap(false, true) {
		refused(fail(StatusCmdSeqError, "a second Connect on the queue"))
		return
	}
	// A refused Connect lets the host try again on the queue.
	refuse := func(err error) {
		q.connecting.Store(false)
		refused(err)
	}
	if err := q.parseData(sl, ConnectDataLen); err != nil {
		refuse(err)
		return
	}
	switch {
	case sl.data.Len != ConnectDataLen:
		refuse(fail(StatusSGLInvalidData, "Connect data of %d bytes", sl.data.Len))
		return
	case c.ConnectRecFmt() != 0:
		refuse(fail(StatusConnectFormat, "record format %d", c.ConnectRecFmt()))
		return
	case c.ConnectQID() != q.qid:
		refuse(invalidParam(ipoQID, "Connect for qid %d on the connection of qid %d", c.ConnectQID(), q.qid))
		return
	case c.ConnectSQSize() == 0 || int(c.ConnectSQSize()) >= q.size:
		refuse(invalidParam(ipoSQSize, "SQ size %d (0-based) on a queue of %d entries", c.ConnectSQSize(), q.size))
		return
	}
	// The submission queue is SQSIZE+1 entries from now on: the SQ head
	// pointer wraps there.
	q.sqEntries = uint32(c.ConnectSQSize()) + 1
	q.sqhd.Store(q.sqhd.Load() % q.sqEntries)
	kato := time.Duration(c.ConnectKATO()) * time.Millisecond
	n := ConnectDataLen
	if sl.data.InCapsule {
		n = 0
	}
	q.withBuffer(sl, n, true, func(sl *slot) {
		q.fetch(sl, func(sl *slot) {
			d, _ := ParseConnectData(sl.payload())
			if q.qid == 0 {
				// Opening the volume may wait for the store.
				q.run(sl, false, func(sl *slot) {
					if err := q.connectAdmin(d, kato); err != nil {
						refuse(err)
						return
					}
					q.complete(sl, uint64(q.ctrl.Load().id), nil)
				})
				return
			}
			if err := q.connectIO(d); err != nil {
				refuse(err)
				return
			}
			q.complete(sl, uint64(q.ctrl.Load().id), nil)
		})
	})
}

// connectNQNs checks the NQNs of Connect data.
func connectNQNs(d ConnectData) (sub, host string, err error) {
	sub, ok := d.SubNQN()
	if !ok || sub == "" {
		return "", "", invalidParam(ipoConnectData|ConnectDataSubNQNOff, "subsystem NQN is not a NUL-terminated string of 1-%d bytes", MaxNQNLen)
	}
	host, ok = d.HostNQN()
	if !ok || !ValidNQN(host) {
		return "", "", invalidParam(ipoConnectData|ConnectDataHostNQNOff, "host NQN %q is not a valid NQN", host)
	}
	return sub, host, nil
}

// connectAdmin makes the controller of an admin queue's Connect.
func (q *queue) connectAdmin(d ConnectData, kato time.Duration) error {
	s := q.s
	sub, host, err := connectNQNs(d)
	if err != nil {
		return err
	}
	if d.CntlID() != DynamicCntlID {
		return invalidParam(ipoConnectData|ConnectDataCntlIDOff, "controller ID 0x%04x on an admin queue: this subsystem only makes controllers dynamically (0xffff)", d.CntlID())
	}
	var c *controller
	if sub == DiscoveryNQN {
		c = s.newController(sub, host, d.HostID(), q)
		c.disc = true
	} else {
		vol, ok := s.volumeOf(sub)
		if !ok {
			return invalidParam(ipoConnectData|ConnectDataSubNQNOff, "no subsystem %s", sub)
		}
		if !s.allowed(vol, host, q.remote) {
			e := fail(StatusConnectInvalidHost, "host %s from %s may not use %s", host, q.remote, sub)
			e.Result = ipoConnectData | ConnectDataHostNQNOff
			return e
		}
		ctx, cancel := context.WithTimeout(q.ctx, 30*time.Second)
		fe, err := s.cfg.Target.OpenFrontendSession(ctx, vol, host)
		cancel()
		switch {
		case errors.Is(err, store.ErrNotFound):
			return invalidParam(ipoConnectData|ConnectDataSubNQNOff, "no subsystem %s: %v", sub, err)
		case errors.Is(err, target.ErrNoSlot):
			return fail(StatusConnectCtrlBusy, "%v", err)
		case err != nil:
			return fmt.Errorf("nvmf: opening %s: %w", vol, err)
		}
		c = s.newNVMController(fe, sub, host, d.HostID(), q)
	}
	if !s.addController(c) {
		if c.fe != nil {
			c.fe.End("nvmf: no controller ID")
		}
		return fail(StatusConnectCtrlBusy, "no free controller ID, or shutting down")
	}
	s.m.Controllers.Add(1)
	s.m.ControllersTotal.Add(1)
	c.mu.Lock()
	c.queues[0] = q
	c.connKATO = kato
	c.setKeepAliveLocked(kato)
	c.mu.Unlock()
	q.ctrl.Store(c)
	if q.isDead() {
		// The queue went while the volume was opened: nobody else will
		// tell the controller.
		go c.end("admin queue ended during Connect")
	}
	s.log.Info("controller created", "cntlid", c.id, "subnqn", sub, "hostnqn", host, "peer", q.remote, "kato", kato,
		"mpa_rev", q.info.Rev, "crc", q.info.CRC)
	return nil
}

// connectIO joins an I/O queue to its host's controller.
func (q *queue) connectIO(d ConnectData) error {
	sub, host, err := connectNQNs(d)
	if err != nil {
		return err
	}
	c := q.s.controller(d.CntlID())
	if c == nil || c.subNQN != sub || c.hostNQN != host {
		return invalidParam(ipoConnectData|ConnectDataCntlIDOff, "no controller 0x%04x of %s for %s", d.CntlID(), sub, host)
	}
	if c.disc {
		return invalidParam(ipoQID, "a discovery controller has no I/O queues")
	}
	// Every queue is held to the volume's access rule, not only the
	// admin queue: without an allow-list that rule is the queue's own
	// peer address, which a controller ID and NQNs do not vouch for.
	if vol, _ := q.s.volumeOf(sub); !q.s.allowed(vol, host, q.remote) {
		e := fail(StatusConnectInvalidHost, "host %s from %s may not use %s", host, q.remote, sub)
		e.Result = ipoConnectData | ConnectDataHostNQNOff
		return e
	}
	if !c.ready() {
		return fail(StatusCmdSeqError, "I/O queue Connect before the controller is enabled")
	}
	if ok, why := c.addQueue(q); !ok {
		return invalidParam(ipoQID, "qid %d: %s", q.qid, why)
	}
	q.ctrl.Store(c)
	if q.isDead() {
		c.queueGone(q, "ended during Connect")
	}
	q.log.Debug("I/O queue connected", "cntlid", c.id, "size", q.size)
	return nil
}
