package rnic

import (
	"fmt"

	"github.com/rnic-dev/rnic/rnic/term"
)

// MW is a memory window handle (draft §7.10): a cheap, per-QP grant of
// remote access to part of a memory region, bound and invalidated with send
// queue work requests.
type MW struct {
	pd *PD
	e  *stagEntry
}

// MWInfo is what Query MW returns.
type MWInfo struct {
	STag      STag
	Valid     bool
	PD        uint32
	Access    Access
	QPID      uint32 // bound QP (valid windows)
	MR        STag   // bound region (valid windows)
	ZeroBased bool
	Base      uint64
	Len       uint64
}

// AllocMW allocates a memory window in the Invalid state, key 0.
func (pd *PD) AllocMW() (*MW, error) {
	d := pd.dev
	e := &stagEntry{kind: kindMW, pd: pd}
	if err := pd.ref(); err != nil {
		return nil, fmt.Errorf("rnic: allocate MW: %w", err)
	}
	if err := d.stags.alloc(e); err != nil {
		pd.unref()
		return nil, err
	}
	return &MW{pd: pd, e: e}, nil
}

// STag returns the window's current STag.
func (mw *MW) STag() STag {
	mw.e.mu.RLock()
	defer mw.e.mu.RUnlock()
	return mw.e.stag()
}

// Query returns the window's attributes.
func (mw *MW) Query() (MWInfo, error) {
	e := mw.e
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.gone {
		return MWInfo{}, fmt.Errorf("rnic: query MW: %w", ErrInvalidSTag)
	}
	info := MWInfo{STag: e.stag(), Valid: e.valid, PD: e.pd.id, Access: e.access, ZeroBased: e.zeroBased,
		Base: e.base, Len: e.length}
	if e.valid {
		info.QPID = e.qp.id
		info.MR = e.mr.stag()
	}
	return info, nil
}

// Dealloc deallocates the window, unbinding it if it is bound.
func (mw *MW) Dealloc() error {
	e := mw.e
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		return fmt.Errorf("rnic: deallocate MW: %w", ErrInvalidSTag)
	}
	if e.valid {
		e.unbindLocked()
	}
	e.gone = true
	pd := e.pd
	mw.pd.dev.stags.release(e)
	e.mu.Unlock()
	pd.unref()
	return nil
}

// unbindLocked drops a valid window's binding (e.mu held). The window keeps
// the PD of the QP it was bound to.
func (e *stagEntry) unbindLocked() {
	if mr := e.mr; mr != nil {
		mr.mu.Lock()
		mr.mwCount--
		mr.mu.Unlock()
	}
	if e.qp != nil {
		e.qp.mwBound.Add(-1)
		e.pd = e.qp.pd
	}
	e.valid = false
	e.qp = nil
	e.mr = nil
}

// bindMW executes a Bind MW work request on qp (draft §7.10.2).
func (d *Device) bindMW(qp *QP, b *BindMW) Status {
	if b == nil {
		return StatusInvalidWQE
	}
	if !qp.cfg.BindMW {
		return StatusAccessViolation
	}
	w := d.stags.lookup(b.MW)
	if w == nil {
		return StatusInvalidWindow
	}
	if b.MR.Index() == 0 {
		return StatusInvalidRegion
	}
	r := d.stags.lookup(b.MR)
	if r == nil {
		return StatusInvalidRegion
	}
	// Lock order: window, then region.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone || w.kind != kindMW {
		return StatusInvalidWindow
	}
	if w.valid {
		return StatusSTagNotInvalid
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone || r.kind != kindMR || r.key != b.MR.Key() {
		return StatusInvalidRegion
	}
	if !r.valid {
		return StatusMRNotValid
	}
	if w.pd != qp.pd || r.pd != qp.pd {
		return StatusInvalidPD
	}
	if r.access&MWBind == 0 {
		return StatusAccessViolation
	}
	if b.Access&^(RemoteRead|RemoteWrite|RemoteAtomic) != 0 || b.Access == 0 {
		return StatusAccessViolation
	}
	if b.Access&(RemoteWrite|RemoteAtomic) != 0 && r.access&LocalWrite == 0 {
		return StatusAccessViolation
	}
	if b.Access&RemoteRead != 0 && r.access&LocalRead == 0 {
		return StatusAccessViolation
	}
	if r.zeroBased {
		return StatusInvalidRegion
	}
	// The window is b.VA .. b.VA+Len in the region's TO space.
	var off uint64
	if b.Len > 0 {
		o, f := r.checkRange(b.VA, b.Len)
		switch f {
		case faultWrap:
			return StatusWrap
		case faultBounds:
			return StatusBaseBounds
		}
		off = o
	} else {
		if b.VA < r.base || b.VA-r.base > r.length {
			return StatusBaseBounds
		}
		off = b.VA - r.base
	}
	w.valid = true
	w.key = b.MW.Key()
	w.access = b.Access
	w.qp = qp
	w.mr = r
	w.mwOff = off
	w.length = b.Len
	w.zeroBased = b.ZeroBased
	if b.ZeroBased {
		w.base = 0
	} else {
		w.base = b.VA
	}
	r.mwCount++
	qp.mwBound.Add(1)
	return StatusSuccess
}

// invalidateFault is the outcome of an invalidation attempt.
type invalidateFault struct {
	status Status     // for a local invalidation's completion
	cause  term.Cause // for a remote invalidation's Terminate
}

var invalidateOK = invalidateFault{}

// invalidate runs the checks of draft §7.8 / C11.10 and invalidates s for
// qp. remote marks an incoming Send with Invalidate.
func (d *Device) invalidate(qp *QP, s STag, remote bool) invalidateFault {
	prot := func(c term.Code, st Status) invalidateFault {
		return invalidateFault{status: st, cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: c}}
	}
	// An STag not associated with the stream (another PD, a window bound to
	// another QP). RFC 5040 §5.3: on a Send with Invalidate the RDMAP layer
	// MUST "Invalidate the STag if it is associated with the RDMAP Stream;
	// or issue a Terminate Message with the STag Cannot be Invalidated
	// Terminate Error Code, if the STag is not associated with the RDMAP
	// Stream": 0/1/0x09, not 0x03 "STag not associated with RDMAP Stream"
	// (that one is for a Read Request's source STag, §7.2 4b). A local
	// Invalidate completes with StatusInvalidPD.
	notAssociated := prot(term.ProtSTagNotAssociated, StatusInvalidPD)
	if remote {
		notAssociated = prot(term.ProtCannotInvalidate, StatusInvalidPD)
	}
	e := d.stags.lookup(s)
	if e == nil {
		return prot(term.ProtInvalidSTag, StatusInvalidSTag)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || e.key != s.Key() {
		return prot(term.ProtInvalidSTag, StatusInvalidSTag)
	}
	switch e.kind {
	case kindMR:
		if e.shared {
			return prot(term.ProtCannotInvalidate, StatusInvalidSTag)
		}
		if e.pd != qp.pd {
			return notAssociated
		}
		if e.mwCount > 0 {
			return prot(term.ProtCannotInvalidate, StatusInvalidSTag)
		}
	case kindMW:
		if e.valid && e.qp != qp {
			return notAssociated
		}
		if !e.valid && e.pd != qp.pd {
			return notAssociated
		}
	}
	if remote {
		if !qp.cfg.InboundRead && !qp.cfg.InboundWrite && !qp.cfg.InboundAtomic {
			return prot(term.ProtAccessRights, StatusInvalidateFailed)
		}
		if e.valid && !e.access.Remote() {
			return prot(term.ProtAccessRights, StatusInvalidateFailed)
		}
		if !e.valid && !e.remoteFlag && e.kind == kindMR {
			return prot(term.ProtAccessRights, StatusInvalidateFailed)
		}
	}
	if e.kind == kindMW {
		if e.valid {
			e.unbindLocked()
		}
	} else {
		e.valid = false
	}
	return invalidateOK
}
