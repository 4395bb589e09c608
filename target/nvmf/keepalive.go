package nvmf

import "time"

// The keep alive timer (NVMe Base 2.0 §3.9). The host gives its keep
// alive timeout (KATO) in Connect and may change it with Set Features
// 0x0F; it then sends a Keep Alive at least every KATO (Linux: every
// KATO/2). Any command on any of the controller's queues also counts as
// the host being alive (traffic-based keep alive: a busy host's Keep Alive
// may queue behind its I/O). A controller that hears nothing for KATO
// (plus Config.KATOGrace) is dropped with all its queues: the host sees
// its connections end and recovers (it reconnects, or gives up after its
// controller loss timeout). KATO 0 disables the timer (discovery
// controllers usually ask for that).

// kasUnits is KAS, the granularity of the keep alive timer in Identify
// Controller, in units of 100 ms: the timer is checked to the millisecond.
const kasUnits = 1

// setKeepAlive (re)arms the timer for kato. c.mu held.
func (c *controller) setKeepAliveLocked(kato time.Duration) {
	c.kato = kato
	if c.kaTimer != nil {
		c.kaTimer.Stop()
		c.kaTimer = nil
	}
	if kato <= 0 || c.ended {
		return
	}
	c.kaSeen = c.activity.Load()
	c.kaArmed++
	armed := c.kaArmed
	c.kaTimer = time.AfterFunc(kato+c.s.cfg.KATOGrace, func() { c.checkKeepAlive(armed) })
}

// checkKeepAlive runs when the timer of arming armed fires: it drops the
// controller if no command came during the whole period, else starts
// another. Stop does not hold back a callback that has already begun: one
// that waited for c.mu while Set Features KATO re-armed the timer (and
// set kaSeen to the activity that command made) is of an older arming,
// and leaves the new period alone.
func (c *controller) checkKeepAlive(armed uint64) {
	c.mu.Lock()
	limit := c.kato + c.s.cfg.KATOGrace
	if c.ended || c.kato <= 0 || armed != c.kaArmed {
		c.mu.Unlock()
		return
	}
	if n := c.activity.Load(); n != c.kaSeen {
		c.kaSeen = n
		c.kaTimer.Reset(limit)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.s.m.KeepAliveExpired.Add(1)
	c.s.log.Warn("keep alive timeout: dropping the controller", "cntlid", c.id, "hostnqn", c.hostNQN, "kato", c.kato)
	c.end("keep alive timeout")
}
