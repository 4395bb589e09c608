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
	c.kaTimer = time.AfterFunc(kato+c.s.cfg.KATOGrace, c.checkKeepAlive)
}

// checkKeepAlive runs when the timer fires: it drops the controller if no
// command came during the whole period, else starts another.
func (c *controller) checkKeepAlive() {
	c.mu.Lock()
	limit := c.kato + c.s.cfg.KATOGrace
	if c.ended || c.kato <= 0 {
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
