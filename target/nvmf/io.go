package nvmf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// The NVM command set: where an NVMe command becomes a block request.
// Namespace 1 is the volume, in blocks of store.BlockSize (4 KiB: LBA
// format 0 has LBADS 12), so every request is whole blocks:
//
//	Read          -> Volume.ReadBlocks, then RDMA Write to the host
//	Write         -> (in-capsule data, or RDMA Read from the host) Volume.WriteBlocks
//	Flush         -> Volume.Flush (the store's sync)
//	DSM deallocate-> Volume.Trim per range
//	Write Zeroes  -> Volume.WriteZeroes
//
// Writes and write-zeroes are durable before they complete (FUA, whatever
// the host asked) unless Config.WriteBack: see there for why; with
// WriteBack the host's FUA is passed on.
//
// Writes, trims and write-zeroes run under the volume's lock table
// (target.FrontendSession.Mutate): a reservation held through the native
// protocol refuses them with Reservation Conflict. Reservation commands are
// in reservation.go.

// dsmRangeLen is the size of one Dataset Management range.
const dsmRangeLen = 16

func (c *controller) io(q *queue, sl *slot, cmd Command) {
	op := cmd.Opcode()
	if !c.ready() {
		q.complete(sl, 0, fail(StatusCmdSeqError, "I/O opcode 0x%02x while the controller is not enabled", op))
		return
	}
	switch op {
	case IORead, IOWrite, IOWriteZeroes, IODSM:
		if cmd.NSID() != 1 {
			q.complete(sl, 0, fail(StatusInvalidNS, "opcode 0x%02x to namespace %d", op, cmd.NSID()))
			return
		}
	case IOFlush:
		if n := cmd.NSID(); n != 1 && n != 0xffffffff {
			q.complete(sl, 0, fail(StatusInvalidNS, "Flush of namespace %d", n))
			return
		}
	case IOResvRegister, IOResvReport, IOResvAcquire, IOResvRelease:
		c.reservation(q, sl, cmd)
		return
	default:
		q.complete(sl, 0, fail(StatusInvalidOpcode, "I/O opcode 0x%02x", op))
		return
	}
	switch op {
	case IORead:
		c.read(q, sl, cmd)
	case IOWrite:
		c.write(q, sl, cmd)
	case IOFlush:
		c.flush(q, sl)
	case IODSM:
		c.deallocate(q, sl, cmd)
	case IOWriteZeroes:
		c.writeZeroes(q, sl, cmd)
	}
}

// checkRange checks that nlb blocks at slba lie in the namespace. A
// range past the size last seen is checked again against the store
// handle's: the volume may have grown meanwhile (reading the handle's size
// copies its Info, too dear for every command).
func (c *controller) checkRange(slba, nlb uint64) error {
	inside := func(n uint64) bool { return nlb <= n && slba <= n-nlb }
	if n := c.blocks.Load(); inside(n) {
		return nil
	}
	if n := c.namespaceBlocks(); !inside(n) {
		return fail(StatusLBARange, "%d blocks at LBA %d, the namespace has %d", nlb, slba, n)
	}
	return nil
}

// transfer checks the LBA range and data pointer of a read or write:
// nlb blocks, at most MDTS, a data pointer of exactly their size. It
// returns the byte count.
func (c *controller) transfer(q *queue, sl *slot, cmd Command, write bool) (int, error) {
	slba, nlb := cmd.SLBA(), uint64(cmd.NLB())
	n := nlb * store.BlockSize
	if err := c.checkRange(slba, nlb); err != nil {
		return 0, err
	}
	if n > uint64(c.s.cfg.MaxTransfer) {
		return 0, fail(StatusInvalidField, "%d bytes, above the %d of MDTS", n, c.s.cfg.MaxTransfer)
	}
	if err := q.parseData(sl, uint32(c.s.cfg.MaxTransfer)); err != nil {
		return 0, err
	}
	switch {
	case sl.data.InCapsule && !write:
		return 0, fail(StatusInvalidField, "in-capsule data with a Read")
	case uint64(sl.data.Len) != n:
		return 0, fail(StatusSGLInvalidData, "SGL of %d bytes for %d blocks", sl.data.Len, nlb)
	}
	return int(n), nil
}

func (c *controller) read(q *queue, sl *slot, cmd Command) {
	sl.kind = target.OpRead
	n, err := c.transfer(q, sl, cmd, false)
	if err != nil {
		q.complete(sl, 0, err)
		return
	}
	slba := cmd.SLBA()
	q.withBuffer(sl, n, c.inMemory, func(sl *slot) {
		if err := c.fe.Volume().ReadBlocks(q.ctx, slba, sl.buf[:n]); err != nil {
			q.complete(sl, 0, c.storeError(q, "read", err))
			return
		}
		c.reads.Add(1)
		c.bytesRead.Add(uint64(n))
		c.s.m.BytesRead.Add(uint64(n))
		q.completeData(sl, n, 0)
	})
}

func (c *controller) write(q *queue, sl *slot, cmd Command) {
	sl.kind = target.OpWrite
	n, err := c.transfer(q, sl, cmd, true)
	if err == nil && c.fe.ReadOnly() {
		err = fail(StatusNSWriteProtected, "volume %s is read-only", c.volume.Name)
	}
	if err != nil {
		q.complete(sl, 0, err)
		return
	}
	slba, fua := cmd.SLBA(), cmd.FUA() || !c.s.cfg.WriteBack
	bufLen := n
	if sl.data.InCapsule {
		bufLen = 0
		c.s.m.InCapsuleWrites.Add(1)
	}
	q.withBuffer(sl, bufLen, true, func(sl *slot) {
		q.fetch(sl, func(sl *slot) {
			q.run(sl, c.inMemory, func(sl *slot) {
				err := c.fe.Mutate(func() error {
					defer c.fe.LockBlocks(slba, uint64(n)/store.BlockSize)()
					return c.fe.Volume().WriteBlocks(q.ctx, slba, sl.payload(), fua)
				})
				if err != nil {
					q.complete(sl, 0, c.storeError(q, "write", err))
					return
				}
				c.writes.Add(1)
				c.bytesWritten.Add(uint64(n))
				c.s.m.BytesWrit.Add(uint64(n))
				q.complete(sl, 0, nil)
			})
		})
	})
}

func (c *controller) flush(q *queue, sl *slot) {
	sl.kind = target.OpFlush
	if !noData(q, sl) {
		return
	}
	q.run(sl, false, func(sl *slot) {
		if err := c.fe.Volume().Flush(q.ctx); err != nil {
			q.complete(sl, 0, c.storeError(q, "flush", err))
			return
		}
		q.complete(sl, 0, nil)
	})
}

// deallocate is Dataset Management: with the Deallocate attribute (AD,
// CDW11 bit 2) every range is trimmed; without it the ranges are only
// hints and nothing is done. All ranges are checked before any is
// trimmed.
func (c *controller) deallocate(q *queue, sl *slot, cmd Command) {
	sl.kind = target.OpTrim
	nr := int(cmd.CDW(10)&0xff) + 1
	ad := cmd.CDW(11)&(1<<2) != 0
	if err := q.parseData(sl, 256*dsmRangeLen); err != nil {
		q.complete(sl, 0, err)
		return
	}
	if int(sl.data.Len) < nr*dsmRangeLen {
		q.complete(sl, 0, fail(StatusSGLInvalidData, "%d bytes of data for %d ranges", sl.data.Len, nr))
		return
	}
	if ad && c.fe.ReadOnly() {
		q.complete(sl, 0, fail(StatusNSWriteProtected, "volume %s is read-only", c.volume.Name))
		return
	}
	bufLen := int(sl.data.Len)
	if sl.data.InCapsule {
		bufLen = 0
	}
	q.withBuffer(sl, bufLen, true, func(sl *slot) {
		q.fetch(sl, func(sl *slot) {
			p := sl.payload()
			type rng struct{ slba, nlb uint64 }
			ranges := make([]rng, 0, nr)
			for i := 0; i < nr; i++ {
				r := p[i*dsmRangeLen:]
				nlb, slba := uint64(binary.LittleEndian.Uint32(r[4:])), binary.LittleEndian.Uint64(r[8:])
				if err := c.checkRange(slba, nlb); err != nil {
					q.complete(sl, 0, err)
					return
				}
				if nlb > 0 {
					ranges = append(ranges, rng{slba, nlb})
				}
			}
			if !ad {
				q.complete(sl, 0, nil)
				return
			}
			q.run(sl, c.inMemory, func(sl *slot) {
				err := c.fe.Mutate(func() error {
					for _, r := range ranges {
						unlock := c.fe.LockBlocks(r.slba, r.nlb)
						err := c.fe.Volume().Trim(q.ctx, r.slba, r.nlb)
						unlock()
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					err = c.storeError(q, "trim", err)
				}
				q.complete(sl, 0, err)
			})
		})
	})
}

func (c *controller) writeZeroes(q *queue, sl *slot, cmd Command) {
	sl.kind = target.OpWriteZeroes
	slba, nlb, fua := cmd.SLBA(), uint64(cmd.NLB()), cmd.FUA() || !c.s.cfg.WriteBack
	err := c.checkRange(slba, nlb)
	if err == nil && c.fe.ReadOnly() {
		err = fail(StatusNSWriteProtected, "volume %s is read-only", c.volume.Name)
	}
	if err == nil {
		err = q.parseData(sl, 0)
	}
	if err != nil {
		q.complete(sl, 0, err)
		return
	}
	q.run(sl, c.inMemory, func(sl *slot) {
		err := c.fe.Mutate(func() error {
			defer c.fe.LockBlocks(slba, nlb)()
			return c.fe.Volume().WriteZeroes(q.ctx, slba, nlb, fua)
		})
		if err != nil {
			err = c.storeError(q, "write zeroes", err)
		}
		q.complete(sl, 0, err)
	})
}

// errUnanswered is the error of a command that gets no completion: its
// controller is ending (storeError), and the host replays the command
// when its connection is gone.
var errUnanswered = errors.New("nvmf: command left unanswered")

// storeError turns a failed block request into its NVMe status (and logs
// the failures that are the target's, not the host's).
func (c *controller) storeError(q *queue, op string, err error) error {
	switch {
	case errors.Is(err, target.ErrReservationConflict):
		return fail(StatusReservationConf, "%v", err)
	case errors.Is(err, target.ErrReadOnly):
		return fail(StatusNSWriteProtected, "%v", err)
	case errors.Is(err, store.ErrOutOfRange):
		return fail(StatusLBARange, "%v", err)
	case errors.Is(err, store.ErrNoSpace):
		// A full thin pool: the host's block layer reports ENOSPC.
		return fail(StatusCapExceeded, "%v", err)
	case errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrClosed) && !q.isDead():
		// Another target took the volume over (the store fenced this
		// handle), and the target ended every session of the volume, this
		// controller's too, or is about to; or it has already, and its
		// last session closed the handle. The controller ends with its
		// queues, as a native session's QPs go down: the host recovers
		// (reconnects, fails over) instead of staying attached to a
		// controller whose every I/O fails. Not here: c.end waits for
		// this command's queue to finish its commands. The command is not
		// answered, as the native sessions leave theirs: the host replays
		// what its lost connection had in flight.
		q.log.Warn("volume fenced or its handle closed under the controller: ending the controller", "op", op,
			"volume", c.volume.Name, "err", err)
		go c.end("volume fenced: another target took it over")
		return fmt.Errorf("%w: %w", errUnanswered, err)
	case errors.Is(err, store.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Teardown: the host retries on its next connection.
		return &StatusError{Status: StatusAbortRequested, Reason: err.Error()}
	}
	q.log.Error("block request failed", "op", op, "volume", c.volume.Name, "err", err)
	if errors.Is(err, store.ErrChecksum) {
		return fail(StatusReadError, "%v", err)
	}
	if op == "read" {
		return &StatusError{Status: StatusInternal, Reason: err.Error()}
	}
	return &StatusError{Status: StatusWriteFault, Reason: err.Error()}
}
