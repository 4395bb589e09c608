package nvmf

import "time"

// Get Features and Set Features (NVMe Base 2.0 §5.21, §5.27). The features
// a host sets over fabrics: the number of I/O queues, the keep alive timeout
// and the asynchronous event configuration; the temperature threshold (the
// Linux hwmon driver reads it once SMART works) and the volatile write
// cache (always enabled: it cannot be turned off, as the store buffers
// writes until a flush). Nothing is saveable.

// Feature identifiers.
const (
	FeatArbitration   = 0x01
	FeatPowerMgmt     = 0x02
	FeatTempThreshold = 0x04
	FeatErrorRecovery = 0x05
	FeatVolatileWC    = 0x06
	FeatNumQueues     = 0x07
	FeatWriteAtomic   = 0x0a
	FeatAsyncEvent    = 0x0b
	FeatKATO          = 0x0f
	FeatHostID        = 0x81
	FeatResvPersist   = 0x83
)

// tempOverDefault is the composite temperature's over-temperature
// threshold until a host sets one: 343 K, 70 °C. The under-temperature
// one starts at 0 (none).
const tempOverDefault = 343

// numQueuesResult is the completion result of Number of Queues: the I/O
// submission and completion queues allocated, both 0-based.
func numQueuesResult(n int) uint64 { return uint64(n-1) | uint64(n-1)<<16 }

func (c *controller) setFeatures(q *queue, sl *slot, cmd Command) {
	fid, save, v := cmd.CDW(10)&0xff, cmd.CDW(10)>>31 != 0, cmd.CDW(11)
	if !noData(q, sl) {
		return
	}
	if save {
		q.complete(sl, 0, fail(StatusFeatNotSaveable, "feature 0x%02x", fid))
		return
	}
	c.mu.Lock()
	var result uint64
	var err error
	switch {
	case fid == FeatNumQueues && !c.disc:
		nsq, ncq := int(v&0xffff)+1, int(v>>16)+1
		if v&0xffff == 0xffff || v>>16 == 0xffff {
			err = fail(StatusInvalidField, "Number of Queues 0x%08x", v)
			break
		}
		if c.hasIOQueueLocked() {
			// NVMe Base 2.0 §5.27.1.5: once an I/O queue exists the number
			// of queues is fixed.
			err = fail(StatusCmdSeqError, "Number of Queues with I/O queues connected")
			break
		}
		n := min(nsq, ncq, c.s.cfg.IOQueues)
		c.ioQueues = n
		result = numQueuesResult(n)
	case fid == FeatAsyncEvent:
		c.aec = v
	case fid == FeatKATO:
		c.setKeepAliveLocked(time.Duration(v) * time.Millisecond)
	case fid == FeatTempThreshold && !c.disc:
		if th := c.tempThresholdLocked(v, true); th != nil {
			*th = uint16(v)
		} else {
			err = fail(StatusInvalidField, "Temperature Threshold 0x%08x: a sensor or threshold type this controller does not have", v)
		}
	case fid == FeatVolatileWC && !c.disc:
		if v&1 == 0 {
			err = fail(StatusFeatNotChange, "the volatile write cache cannot be disabled")
		}
	default:
		err = fail(StatusInvalidField, "Set Features 0x%02x", fid)
	}
	c.mu.Unlock()
	q.complete(sl, result, err)
}

// tempThresholdLocked returns the threshold a Temperature Threshold
// command's CDW11 selects: the composite temperature's (TMPSEL 0, or 1111b,
// all sensors, on Set) over- (THSEL 00b) or under-temperature (01b)
// threshold; nil for another sensor (the SMART log reports none) or a
// reserved THSEL. c.mu held.
func (c *controller) tempThresholdLocked(cdw11 uint32, set bool) *uint16 {
	tmpsel, thsel := cdw11>>16&0xf, cdw11>>20&3
	if tmpsel != 0 && !(set && tmpsel == 0xf) {
		return nil
	}
	switch thsel {
	case 0:
		return &c.tempOver
	case 1:
		return &c.tempUnder
	}
	return nil
}

func (c *controller) getFeatures(q *queue, sl *slot, cmd Command) {
	fid, sel := cmd.CDW(10)&0xff, cmd.CDW(10)>>8&7
	if sel > 3 {
		// SEL 100b to 111b are reserved, and a reserved value in a
		// defined field of a command is an error (NVMe Base 2.0 §1.4).
		q.complete(sl, 0, fail(StatusInvalidField, "Get Features 0x%02x with the reserved Select %03b", fid, sel))
		return
	}
	if fid == FeatHostID && !c.disc {
		// The 128-bit host identifier (EXHID, CDW11 bit 0), as data.
		if cmd.CDW(11)&1 == 0 {
			q.complete(sl, 0, fail(StatusInvalidField, "64-bit host identifier: this controller has 128-bit ones"))
			return
		}
		c.reply(q, sl, 16, 0, func(b []byte) { copy(b, c.hostID[:]) })
		return
	}
	if !noData(q, sl) {
		return
	}
	// SEL 001b asks for the default value; nothing is saveable, so
	// 010b (saved) operates as 001b (NVMe Base 2.0, Get Features, Command
	// Dword 10; Base 2.1 Figure 192).
	dflt := sel == 1 || sel == 2
	c.mu.Lock()
	var result uint64
	changeable := true
	var err error
	switch {
	case fid == FeatNumQueues && !c.disc:
		n := c.s.cfg.IOQueues
		if c.ioQueues > 0 && !dflt {
			n = c.ioQueues
		}
		result, changeable = numQueuesResult(n), false
	case fid == FeatAsyncEvent:
		if !dflt {
			result = uint64(c.aec)
		}
	case fid == FeatKATO:
		kato := c.kato
		if dflt {
			kato = c.connKATO
		}
		result = uint64(kato / time.Millisecond)
	case fid == FeatTempThreshold && !c.disc:
		if th := c.tempThresholdLocked(cmd.CDW(11), false); th != nil {
			result = uint64(*th)
			if dflt {
				result = 0
				if th == &c.tempOver {
					result = tempOverDefault
				}
			}
		} else {
			err = fail(StatusInvalidField, "Temperature Threshold 0x%08x: a sensor or threshold type this controller does not have",
				cmd.CDW(11))
		}
	case fid == FeatVolatileWC && !c.disc:
		result, changeable = 1, false
	case (fid == FeatArbitration || fid == FeatPowerMgmt || fid == FeatErrorRecovery || fid == FeatWriteAtomic ||
		fid == FeatResvPersist) && !c.disc:
		result, changeable = 0, false
	default:
		err = fail(StatusInvalidField, "Get Features 0x%02x", fid)
	}
	c.mu.Unlock()
	if err == nil && sel == 3 {
		// Supported capabilities: bit 2 changeable (none saveable or
		// namespace specific).
		result = 0
		if changeable {
			result = 1 << 2
		}
	}
	q.complete(sl, result, err)
}
