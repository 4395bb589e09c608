package nvmf

// The admin command set over fabrics (NVMe Base 2.0 §5; NVMe over Fabrics
// 1.1 §4.2 lists what a fabrics controller supports): Identify, Get Log
// Page, Get/Set Features, Asynchronous Event Request, Keep Alive and
// Abort. Queue creation and deletion do not exist over fabrics (queues
// are connections). Nothing but fabrics commands is accepted before the
// host has enabled the controller (CC.EN, CSTS.RDY).

// maxAERs is how many Asynchronous Event Requests a controller holds
// (AERL + 1).
const maxAERs = 4

func (c *controller) admin(q *queue, sl *slot, cmd Command) {
	if !c.ready() {
		q.complete(sl, 0, fail(StatusCmdSeqError, "admin opcode 0x%02x while the controller is not enabled", cmd.Opcode()))
		return
	}
	switch cmd.Opcode() {
	case AdminIdentify:
		c.identify(q, sl, cmd)
	case AdminGetLogPage:
		c.getLogPage(q, sl, cmd)
	case AdminSetFeatures:
		c.setFeatures(q, sl, cmd)
	case AdminGetFeatures:
		c.getFeatures(q, sl, cmd)
	case AdminAsyncEvent:
		c.asyncEvent(q, sl)
	case AdminKeepAlive:
		if !noData(q, sl) {
			return
		}
		q.complete(sl, 0, nil)
	case AdminAbort:
		if !noData(q, sl) {
			return
		}
		// Commands are not aborted: result bit 0 says "not aborted".
		q.complete(sl, 1, nil)
	default:
		q.complete(sl, 0, fail(StatusInvalidOpcode, "admin opcode 0x%02x", cmd.Opcode()))
	}
}

// noData checks that a command carries no data pointer to speak of;
// false: it was answered with an error.
func noData(q *queue, sl *slot) bool {
	if err := q.parseData(sl, 0); err != nil {
		q.complete(sl, 0, err)
		return false
	}
	return true
}

// asyncEvent holds an Asynchronous Event Request: this controller reports
// no events (OAES is 0), so it stays outstanding until the controller
// ends. Completing it with an error would stop the host from re-arming;
// more than AERL+1 of them get Asynchronous Event Request Limit Exceeded.
func (c *controller) asyncEvent(q *queue, sl *slot) {
	if !noData(q, sl) {
		return
	}
	c.mu.Lock()
	full := c.aers >= maxAERs
	if !full {
		c.aers++
	}
	c.mu.Unlock()
	if full {
		q.complete(sl, 0, fail(StatusAsyncLimit, "%d Asynchronous Event Requests outstanding", maxAERs))
	}
	// Held: the slot stays in use; teardown releases it.
}
