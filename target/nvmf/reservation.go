package nvmf

import (
	"encoding/binary"
	"errors"

	"github.com/rnic-dev/rnic/target"
)

// Reservations (NVMe Base 2.0 §8.19), on the volume's one lock table: an
// NVMe host that registers a key and acquires a Write Exclusive reservation
// holds the volume's exclusive reservation word, exactly as a native
// initiator's Compare-and-Swap takes it, so native sessions are refused
// writes (StatusReserved) while it holds it; and a reservation a native
// initiator holds makes this host's writes fail with Reservation Conflict
// (io.go). Only Write Exclusive (RTYPE 1) is offered (RESCAP bit 1):
// the native protocol's exclusive reservation leaves reads to everyone.
// Registrations belong to the controller and end with it (no persistence
// through power loss: PTPL is refused); a reservation held when the
// controller ends is released and raises the volume's fence, as when a
// native session ends.

const rtypeWriteExclusive = 1

func (c *controller) reservation(q *queue, sl *slot, cmd Command) {
	if cmd.NSID() != 1 {
		q.complete(sl, 0, fail(StatusInvalidNS, "reservation command on namespace %d", cmd.NSID()))
		return
	}
	if cmd.Opcode() == IOResvReport {
		c.reservationReport(q, sl, cmd)
		return
	}
	need := 16
	if cmd.Opcode() == IOResvRelease {
		need = 8
	}
	if err := q.parseData(sl, 16); err != nil {
		q.complete(sl, 0, err)
		return
	}
	if int(sl.data.Len) < need {
		q.complete(sl, 0, fail(StatusSGLInvalidData, "%d bytes of reservation data, want %d", sl.data.Len, need))
		return
	}
	bufLen := int(sl.data.Len)
	if sl.data.InCapsule {
		bufLen = 0
	}
	q.withBuffer(sl, bufLen, true, func(sl *slot) {
		q.fetch(sl, func(sl *slot) {
			p := sl.payload()
			crkey := binary.LittleEndian.Uint64(p)
			var nkey uint64
			if len(p) >= 16 {
				nkey = binary.LittleEndian.Uint64(p[8:])
			}
			var err error
			switch cmd.Opcode() {
			case IOResvRegister:
				err = c.resvRegister(cmd.CDW(10), crkey, nkey)
			case IOResvAcquire:
				err = c.resvAcquire(cmd.CDW(10), crkey)
			case IOResvRelease:
				err = c.resvRelease(cmd.CDW(10), crkey)
			}
			if st := (*StatusError)(nil); errors.As(err, &st) && st.Status.Code() == StatusReservationConf {
				c.s.m.ReservationConflicts.Add(1)
			}
			q.complete(sl, 0, err)
		})
	})
}

func conflict(format string, a ...any) error { return fail(StatusReservationConf, format, a...) }

// resvRegister: register (RREGA 0), unregister (1) or replace (2) this
// controller's key; IEKEY (bit 3) skips the current key check.
func (c *controller) resvRegister(cdw10 uint32, crkey, nrkey uint64) error {
	rrega, iekey, cptpl := cdw10&7, cdw10&8 != 0, cdw10>>30
	if cptpl == 3 {
		return fail(StatusInvalidField, "persist through power loss is not supported")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch rrega {
	case 0:
		if c.registered && c.resvKey != nrkey {
			return conflict("already registered with another key")
		}
		c.registered, c.resvKey = true, nrkey
	case 1:
		if !c.registered || (!iekey && crkey != c.resvKey) {
			return conflict("unregister: not registered with that key")
		}
		c.registered = false
		c.fe.Unreserve()
	case 2:
		if c.registered && !iekey && crkey != c.resvKey {
			return conflict("replace: current key does not match")
		}
		c.registered, c.resvKey = true, nrkey
	default:
		return fail(StatusInvalidField, "RREGA %d", rrega)
	}
	c.resvGen++
	return nil
}

// resvAcquire: acquire (RACQA 0) a Write Exclusive reservation; preempting
// is not offered.
func (c *controller) resvAcquire(cdw10 uint32, crkey uint64) error {
	racqa, rtype := cdw10&7, cdw10>>8&0xff
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.registered || crkey != c.resvKey {
		return conflict("acquire: not registered with that key")
	}
	switch {
	case racqa != 0:
		return fail(StatusInvalidField, "RACQA %d: only acquire is supported", racqa)
	case rtype != rtypeWriteExclusive:
		return fail(StatusInvalidField, "reservation type %d: only Write Exclusive (1) is supported", rtype)
	}
	if err := c.fe.Reserve(); err != nil {
		if errors.Is(err, target.ErrReservationConflict) {
			return conflict("%v", err)
		}
		return err
	}
	return nil
}

// resvRelease: release (RRELA 0) or clear (1) the reservation.
func (c *controller) resvRelease(cdw10 uint32, crkey uint64) error {
	rrela, rtype := cdw10&7, cdw10>>8&0xff
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.registered || crkey != c.resvKey {
		return conflict("release: not registered with that key")
	}
	switch rrela {
	case 0:
		if _, _, mine, _ := c.fe.Reservation(); mine && rtype != rtypeWriteExclusive {
			return fail(StatusInvalidField, "release of type %d, the reservation is Write Exclusive", rtype)
		}
		c.fe.Unreserve()
	case 1:
		c.fe.Unreserve()
		c.registered = false
		c.resvGen++
	default:
		return fail(StatusInvalidField, "RRELA %d", rrela)
	}
	return nil
}

// reservationReport returns the reservation status: the type held (1 if
// anyone holds the volume's exclusive reservation, native sessions
// included) and this controller's registration, if any, as the one
// registrant it knows (24-byte entries, or 64-byte ones with EDS).
func (c *controller) reservationReport(q *queue, sl *slot, cmd Command) {
	// NUMD is 0-based: computed in 64 bits, 0xFFFFFFFF is 2^32 dwords.
	n := (uint64(cmd.CDW(10)) + 1) * 4
	if n > uint64(c.s.cfg.MaxTransfer) {
		q.complete(sl, 0, fail(StatusInvalidField, "report of %d bytes", n))
		return
	}
	eds := cmd.CDW(11)&1 != 0
	c.mu.Lock()
	held, excl, mine, _ := c.fe.Reservation()
	reg, key, gen := c.registered, c.resvKey, c.resvGen
	c.mu.Unlock()
	full := make([]byte, 64+64)
	binary.LittleEndian.PutUint32(full[0:], gen)
	if held && excl {
		full[4] = rtypeWriteExclusive
	}
	hdr, entry := 24, 24
	if eds {
		hdr, entry = 64, 64
	}
	if reg {
		binary.LittleEndian.PutUint16(full[5:], 1)
		e := full[hdr:]
		binary.LittleEndian.PutUint16(e[0:], c.id)
		if mine {
			e[2] = 1
		}
		if eds {
			binary.LittleEndian.PutUint64(e[8:], key)
			copy(e[16:32], c.hostID[:])
		} else {
			copy(e[8:16], c.hostID[:8])
			binary.LittleEndian.PutUint64(e[16:], key)
		}
	}
	full = full[:hdr+entry]
	c.reply(q, sl, int(n), 0, func(b []byte) { clear(b[copy(b, full):]) })
}
