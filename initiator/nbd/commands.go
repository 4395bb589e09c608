package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
)

// allowedFlags are the command flags accepted per command. FUA is
// accepted on every command, as the specification requires once
// NBD_FLAG_SEND_FUA is advertised (it is a no-op where nothing is
// written). DF and FAST_ZERO belong to features this server does not
// advertise and are refused with EINVAL.
func allowedFlags(typ uint16) uint16 {
	switch typ {
	case CmdWriteZeroes:
		return CmdFlagFUA | CmdFlagNoHole
	case CmdBlockStatus:
		return CmdFlagFUA | CmdFlagReqOne
	}
	return CmdFlagFUA
}

// check validates a request against the export before it is run and
// returns the NBD error to answer with, or 0:
//
//   - unknown command, NBD_CMD_BLOCK_STATUS without base:allocation
//     selected, or a flag not valid for the command: EINVAL;
//   - NBD_CMD_BLOCK_STATUS of length 0: EINVAL;
//   - WRITE, TRIM or WRITE_ZEROES on a read-only export: EPERM;
//   - FLUSH with a nonzero offset or length: EINVAL;
//   - READ or WRITE longer than MaxBlock: EINVAL;
//   - offset or length not a multiple of MinBlock: EINVAL;
//   - a range past the end of the export: ENOSPC for WRITE and
//     WRITE_ZEROES, EINVAL for READ, TRIM and CACHE.
func check(sel selected, r *request) uint32 {
	exp, size := sel.exp, sel.size
	switch r.typ {
	case CmdRead, CmdWrite, CmdFlush, CmdTrim, CmdWriteZeroes, CmdCache:
	case CmdBlockStatus:
		if !sel.metaAlloc || r.length == 0 {
			return EINVAL
		}
	default:
		return EINVAL
	}
	if r.flags&^allowedFlags(r.typ) != 0 {
		return EINVAL
	}
	writes := r.typ == CmdWrite || r.typ == CmdTrim || r.typ == CmdWriteZeroes
	if writes && exp.ReadOnly {
		return EPERM
	}
	if r.typ == CmdFlush {
		if r.off != 0 || r.length != 0 {
			return EINVAL
		}
		return 0
	}
	if (r.typ == CmdRead || r.typ == CmdWrite) && r.length > exp.MaxBlock {
		return EINVAL
	}
	if m := uint64(exp.MinBlock); r.off%m != 0 || uint64(r.length)%m != 0 {
		return EINVAL
	}
	// off + length cannot overflow: off is compared first.
	if r.off > uint64(size) || uint64(r.length) > uint64(size)-r.off {
		if r.typ == CmdWrite || r.typ == CmdWriteZeroes {
			return ENOSPC
		}
		return EINVAL
	}
	return 0
}

// execute runs a checked request on the backend and sets r.errno.
func (t *transmission) execute(r *request) {
	be := t.sel.exp.Backend
	ctx := t.ctx
	off, n := int64(r.off), int64(r.length)
	fua := r.flags&CmdFlagFUA != 0
	var err error
	switch r.typ {
	case CmdRead:
		err = be.ReadAt(ctx, *r.buf, off)
	case CmdWrite:
		if n > 0 {
			err = be.WriteAt(ctx, *r.buf, off, fua)
		}
	case CmdFlush:
		err = t.flush()
	case CmdTrim:
		err = be.Trim(ctx, off, n)
		if errors.Is(err, errors.ErrUnsupported) {
			err = nil // a hint the backend may ignore
		}
		if err == nil && fua {
			err = be.Flush(ctx)
		}
	case CmdWriteZeroes:
		switch az, ok := be.(AllocatedZeroer); {
		case r.flags&CmdFlagNoHole == 0:
			// The server may punch holes: WriteZeroes may.
			err = be.WriteZeroes(ctx, off, n, fua)
		case ok:
			err = az.WriteZeroesAllocated(ctx, off, n, fua)
		default:
			err = t.writeZeroes(off, n, fua)
		}
	case CmdCache:
		// Advisory and not advertised; accepted as a no-op.
	case CmdBlockStatus:
		err = t.blockStatus(r)
	}
	t.finish(r, err)
}

// errLostElsewhere fails the FLUSH of a client whose writes may be among
// those whose loss the Backend reported to another FLUSH.
var errLostElsewhere = errors.New("nbd: writes acknowledged since this connection's last FLUSH may be lost: " +
	"the backend reported a loss of acknowledged writes to another FLUSH since")

// flush runs NBD_CMD_FLUSH. A LossCounter Backend reports a loss of
// acknowledged writes to one Flush only, which may be another
// connection's: this FLUSH then fails too (EIO) if a write was
// acknowledged to this client before the loss was reported (dirtyLoss),
// since that write may be among those lost. (One acknowledged after the
// crash but before the report makes it fail needlessly: the two cannot be
// told apart here.) It is reported once: the FLUSH takes the writes
// acknowledged so far off dirtyLoss, and gives them back only when it
// fails otherwise, so that a later FLUSH still covers them.
func (t *transmission) flush() error {
	be := t.sel.exp.Backend
	if t.losses == nil {
		return be.Flush(t.ctx)
	}
	dl := t.dirtyLoss.Swap(0)
	err := be.Flush(t.ctx)
	lost := dl != 0 && t.losses.WriteLosses() >= dl
	switch {
	case lost && err == nil:
		return &Error{Errno: EIO, Err: errLostElsewhere}
	case err != nil && !lost && dl != 0:
		// Nothing was flushed for sure: keep the older mark.
		for {
			cur := t.dirtyLoss.Load()
			if cur != 0 && cur <= dl || t.dirtyLoss.CompareAndSwap(cur, dl) {
				break
			}
		}
	}
	return err
}

// noteWrite records a write acknowledged to the client (finish) for
// flush: one with FUA is durable already.
func (t *transmission) noteWrite(r *request) {
	if t.losses == nil || r.flags&CmdFlagFUA != 0 || t.dirtyLoss.Load() != 0 {
		return
	}
	switch r.typ {
	case CmdWrite, CmdTrim, CmdWriteZeroes:
		t.dirtyLoss.CompareAndSwap(0, 1+t.losses.WriteLosses())
	}
}

// zeroPayload is the data writeZeroes writes: zeros, shared by every
// request (a Backend only reads what WriteAt is given).
var zeroPayload = make([]byte, 1<<20)

// writeZeroes serves NBD_CMD_FLAG_NO_HOLE for a Backend that is no
// AllocatedZeroer: zeroes written with WriteAt, in pieces of at most the
// export's maximum payload, are allocated as any written data; for FUA a
// Flush follows (it covers every piece).
func (t *transmission) writeZeroes(off, n int64, fua bool) error {
	be, ctx := t.sel.exp.Backend, t.ctx
	piece := min(int64(len(zeroPayload)), int64(t.sel.exp.MaxBlock))
	for at := int64(0); at < n; at += piece {
		if err := be.WriteAt(ctx, zeroPayload[:min(piece, n-at)], off+at, false); err != nil {
			return err
		}
	}
	if fua {
		return be.Flush(ctx)
	}
	return nil
}

// maxDescriptors bounds the descriptors of one BLOCK_STATUS reply: the
// client asks again from where they end.
const maxDescriptors = 512

// blockStatus fills r.ext with the base:allocation descriptors of r's
// range: holes (NBD_STATE_HOLE|NBD_STATE_ZERO) and data, at most
// maxDescriptors of them (one with NBD_CMD_FLAG_REQ_ONE), covering at most
// the range.
func (t *transmission) blockStatus(r *request) error {
	bs, ok := t.sel.exp.Backend.(BlockStatuser)
	if !ok {
		return &Error{Errno: EINVAL, Err: errors.New("the backend reports no allocation")}
	}
	limit := maxDescriptors
	if r.flags&CmdFlagReqOne != 0 {
		limit = 1
	}
	r.ext = r.ext[:0]
	var last uint32 // flags of the descriptor ext ends with
	err := bs.BlockStatus(t.ctx, int64(r.off), int64(r.length), func(n int64, hole bool) bool {
		flags := uint32(0)
		if hole {
			flags = StateHole | StateZero
		}
		k := len(r.ext) / 8
		if k > 0 && last == flags {
			d := r.ext[len(r.ext)-8:]
			binary.BigEndian.PutUint32(d, binary.BigEndian.Uint32(d)+uint32(n)) // within the 32-bit request length
			return true
		}
		if k == limit {
			return false
		}
		r.ext = binary.BigEndian.AppendUint32(r.ext, uint32(n))
		r.ext = binary.BigEndian.AppendUint32(r.ext, flags)
		last = flags
		return true
	})
	if err == nil && len(r.ext) == 0 {
		err = &Error{Errno: EIO, Err: errors.New("the backend reported no extent")}
	}
	return err
}

// finish records the outcome of r's backend call: the NBD error, and for
// a failed READ no payload; a write that succeeded is noted for flush.
func (t *transmission) finish(r *request, err error) {
	ctx := t.ctx
	if err == nil {
		t.noteWrite(r)
	} else {
		r.errno = Errno(err)
		if r.typ == CmdRead {
			t.c.pool.put(r.buf) // no payload goes out with an error
			r.buf = nil
		}
		lvl := slog.LevelWarn
		if ctx.Err() != nil {
			lvl = slog.LevelDebug // shutting down; every request fails alike
		}
		t.c.log.Log(ctx, lvl, "nbd: request failed", "cmd", commandName(r.typ), "offset", r.off,
			"length", r.length, "errno", r.errno, "err", err)
	}
}

// commandName names a command for logs.
func commandName(typ uint16) string {
	switch typ {
	case CmdRead:
		return "NBD_CMD_READ"
	case CmdWrite:
		return "NBD_CMD_WRITE"
	case CmdDisc:
		return "NBD_CMD_DISC"
	case CmdFlush:
		return "NBD_CMD_FLUSH"
	case CmdTrim:
		return "NBD_CMD_TRIM"
	case CmdCache:
		return "NBD_CMD_CACHE"
	case CmdWriteZeroes:
		return "NBD_CMD_WRITE_ZEROES"
	case CmdBlockStatus:
		return "NBD_CMD_BLOCK_STATUS"
	}
	return fmt.Sprintf("command %d", typ)
}
