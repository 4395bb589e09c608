package rnic

import (
	"fmt"
	"math"
	"unsafe"
)

// MROptions describe a registration (draft §7.3.2.2).
type MROptions struct {
	Access Access
	// Key is the consumer's 8-bit STag key, used when FixedKey is set;
	// otherwise the device picks an unpredictable one.
	Key      uint8
	FixedKey bool
	// ZeroBased: the region's first byte has TO 0. Otherwise it is VA-based
	// and the first byte has TO VA (if VA is 0, the buffer's address).
	ZeroBased bool
	VA        uint64
	// LocalOnly clears the Remote Access Flag: remote rights can then never
	// be granted to this STag, even by Fast-Register.
	LocalOnly bool
}

// MR is a memory region handle.
type MR struct {
	pd *PD
	e  *stagEntry
}

// MRInfo is what Query MR returns (draft §9.2.6.3, plus the addressing
// fields as a superset).
type MRInfo struct {
	STag         STag
	Valid        bool
	Shared       bool
	PD           uint32
	Access       Access
	RemoteAccess bool // the Remote Access Flag
	MaxPBL       int
	ZeroBased    bool
	Base         uint64 // TO of the first byte
	Len          uint64
	BoundMWs     int
}

func (d *Device) key(o *MROptions) uint8 {
	if o.FixedKey {
		return o.Key
	}
	return d.RandomKey()
}

func firstByteAddr(m Memory) uint64 {
	p := m.Pages[0]
	if m.FBO < len(p) {
		return uint64(uintptr(unsafe.Pointer(&p[m.FBO])))
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))) + uint64(m.FBO)
}

// fill sets the mapping fields of e from m and o, validating them.
func (e *stagEntry) setMapping(m Memory, zeroBased bool, va uint64, maxPBL int) (Status, error) {
	if st, err := m.validate(maxPBL); err != nil {
		return st, err
	}
	base := uint64(0)
	if !zeroBased {
		base = va
		if base == 0 {
			base = firstByteAddr(m)
		}
		if m.PageSize != 0 && base%uint64(m.PageSize) != uint64(m.FBO) {
			return StatusInvalidVA, fmt.Errorf("%w: VA 0x%x mod page size %d != FBO %d", ErrInvalidVA, base, m.PageSize, m.FBO)
		}
		if m.Len > 0 && m.Len-1 > math.MaxUint64-base {
			return StatusInvalidVA, fmt.Errorf("%w: VA 0x%x + length %d wraps", ErrInvalidVA, base, m.Len)
		}
	}
	e.mem = newMapping(m)
	e.placed.Store(0)
	e.base = base
	e.length = m.Len
	e.zeroBased = zeroBased
	return StatusSuccess, nil
}

// RegisterMR registers memory and returns a valid region (RI-Register,
// draft §7.3.2.2).
func (pd *PD) RegisterMR(m Memory, o MROptions) (*MR, error) {
	d := pd.dev
	if !o.Access.valid() {
		return nil, fmt.Errorf("rnic: register MR: %w: %s", ErrInvalidAccess, o.Access)
	}
	if o.LocalOnly && o.Access.Remote() {
		return nil, fmt.Errorf("rnic: register MR: %w: remote rights on a local-only region", ErrInvalidAccess)
	}
	e := &stagEntry{kind: kindMR, valid: true, pd: pd, access: o.Access, remoteFlag: !o.LocalOnly,
		key: d.key(&o), maxPBL: len(m.Pages)}
	if _, err := e.setMapping(m, o.ZeroBased, o.VA, d.cfg.MaxPBL); err != nil {
		return nil, fmt.Errorf("rnic: register MR: %w", err)
	}
	if err := pd.ref(); err != nil {
		return nil, fmt.Errorf("rnic: register MR: %w", err)
	}
	if err := d.stags.alloc(e); err != nil {
		pd.unref()
		return nil, err
	}
	return &MR{pd: pd, e: e}, nil
}

// RegisterBytes registers one contiguous buffer, zero-based, with a random key.
func (pd *PD) RegisterBytes(b []byte, access Access) (*MR, error) {
	return pd.RegisterMR(Bytes(b), MROptions{Access: access, ZeroBased: true})
}

// AllocMRSTag allocates an STag in the Invalid state for later
// Fast-Register work requests, with room for maxPBL buffers (Allocate
// Non-Shared MR STag, draft §7.3.2.1). Its key is 0 until fast-registered.
func (pd *PD) AllocMRSTag(maxPBL int, remoteAccess bool) (*MR, error) {
	d := pd.dev
	if maxPBL <= 0 || maxPBL > d.cfg.MaxPBL {
		return nil, fmt.Errorf("rnic: allocate MR STag: %w: PBL size %d", ErrInsufficientResources, maxPBL)
	}
	e := &stagEntry{kind: kindMR, pd: pd, remoteFlag: remoteAccess, maxPBL: maxPBL}
	if err := pd.ref(); err != nil {
		return nil, fmt.Errorf("rnic: allocate MR STag: %w", err)
	}
	if err := d.stags.alloc(e); err != nil {
		pd.unref()
		return nil, err
	}
	return &MR{pd: pd, e: e}, nil
}

// STag returns the region's current STag (index and key).
func (mr *MR) STag() STag {
	mr.e.mu.RLock()
	defer mr.e.mu.RUnlock()
	return mr.e.stag()
}

// Placed returns how many bytes from the region's first byte inbound RDMA
// Writes and Read Responses through this STag (or a window bound to it)
// have placed without a gap since the region was last registered,
// re-registered or fast-registered (an extension to the verbs). A target that lets a peer write a buffer before it uses the
// buffer's contents learns from it which bytes the peer wrote, so it need
// not clear the buffer first: segments arrive in stream order, so one
// RDMA Write, or several in ascending order, fill a prefix; bytes placed
// past a gap are not counted. Read it once the region can take no more
// placement (after the peer's Send with Invalidate of it, say).
func (mr *MR) Placed() uint64 { return mr.e.placed.Load() }

// PD returns the region's protection domain.
func (mr *MR) PD() *PD {
	mr.e.mu.RLock()
	defer mr.e.mu.RUnlock()
	return mr.e.pd
}

// Query returns the region's attributes.
func (mr *MR) Query() (MRInfo, error) {
	e := mr.e
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.gone {
		return MRInfo{}, fmt.Errorf("rnic: query MR: %w", ErrInvalidSTag)
	}
	return MRInfo{STag: e.stag(), Valid: e.valid, Shared: e.shared, PD: e.pd.id, Access: e.access,
		RemoteAccess: e.remoteFlag, MaxPBL: e.maxPBL, ZeroBased: e.zeroBased, Base: e.base,
		Len: e.length, BoundMWs: e.mwCount}, nil
}

// Reregister changes a non-shared region's memory, rights, key and PD
// (RI-Reregister, draft §7.3.2.3). The index stays the same. On errors other
// than "windows still bound" the old region is deallocated, as the draft
// requires.
func (mr *MR) Reregister(pd *PD, m Memory, o MROptions) error {
	e := mr.e
	d := mr.pd.dev
	e.mu.Lock()
	if e.gone || e.kind != kindMR || e.shared {
		e.mu.Unlock()
		return fmt.Errorf("rnic: reregister MR: %w", ErrInvalidSTag)
	}
	if e.mwCount > 0 {
		e.mu.Unlock()
		return fmt.Errorf("rnic: reregister MR: %w", ErrMWBound)
	}
	fail := func(err error) error {
		e.gone, e.valid = true, false
		e.mem = mapping{}
		d.stags.release(e)
		e.mu.Unlock()
		e.pd.unref()
		return fmt.Errorf("rnic: reregister MR (region deallocated): %w", err)
	}
	if !o.Access.valid() || (o.LocalOnly && o.Access.Remote()) {
		return fail(fmt.Errorf("%w: %s", ErrInvalidAccess, o.Access))
	}
	if pd != e.pd {
		if err := pd.ref(); err != nil {
			return fail(err)
		}
		e.pd.unref()
		e.pd = pd
		mr.pd = pd
	}
	if _, err := e.setMapping(m, o.ZeroBased, o.VA, d.cfg.MaxPBL); err != nil {
		return fail(err)
	}
	if len(m.Pages) > e.maxPBL {
		e.maxPBL = len(m.Pages)
	}
	e.access = o.Access
	e.remoteFlag = !o.LocalOnly
	e.key = d.key(&o)
	e.valid = true
	e.mu.Unlock()
	return nil
}

// RegisterShared registers a new STag over the same memory as mr (Register
// Shared MR, draft §7.3.2.4). current must be mr's current STag (index and
// key). Both regions are Shared afterwards.
func (mr *MR) RegisterShared(current STag, pd *PD, o MROptions) (*MR, error) {
	src := mr.e
	d := pd.dev
	if !o.Access.valid() || (o.LocalOnly && o.Access.Remote()) {
		return nil, fmt.Errorf("rnic: register shared MR: %w: %s", ErrInvalidAccess, o.Access)
	}
	src.mu.Lock()
	if src.gone || src.kind != kindMR || !src.valid || src.stag() != current {
		src.mu.Unlock()
		return nil, fmt.Errorf("rnic: register shared MR: %w", ErrInvalidSTag)
	}
	e := &stagEntry{kind: kindMR, valid: true, shared: true, pd: pd, access: o.Access,
		remoteFlag: !o.LocalOnly, key: d.key(&o), maxPBL: src.maxPBL, mem: src.mem,
		length: src.length, zeroBased: o.ZeroBased}
	if !o.ZeroBased {
		if src.zeroBased {
			src.mu.Unlock()
			return nil, fmt.Errorf("rnic: register shared MR: %w: VA-based share of a zero-based region", ErrInvalidVA)
		}
		e.base = o.VA
		if e.mem.shift != 0 && e.base&e.mem.mask != src.base&src.mem.mask {
			src.mu.Unlock()
			return nil, fmt.Errorf("rnic: register shared MR: %w: VA gives a different first byte offset", ErrInvalidVA)
		}
		if e.length > 0 && e.length-1 > math.MaxUint64-e.base {
			// As setMapping refuses for a region of its own: the end of
			// the region would have no address.
			src.mu.Unlock()
			return nil, fmt.Errorf("rnic: register shared MR: %w: VA 0x%x + length %d wraps", ErrInvalidVA, e.base, e.length)
		}
	}
	src.shared = true
	src.mu.Unlock()
	if err := pd.ref(); err != nil {
		return nil, fmt.Errorf("rnic: register shared MR: %w", err)
	}
	if err := d.stags.alloc(e); err != nil {
		pd.unref()
		return nil, err
	}
	return &MR{pd: pd, e: e}, nil
}

// Dealloc deregisters the region (Deallocate STag, draft §7.9). It waits for
// in-flight placement through the STag; afterwards no access can succeed.
// It fails with ErrMWBound while windows are bound to the region.
func (mr *MR) Dealloc() error {
	e := mr.e
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		return fmt.Errorf("rnic: deallocate MR: %w", ErrInvalidSTag)
	}
	if e.mwCount > 0 {
		e.mu.Unlock()
		return fmt.Errorf("rnic: deallocate MR %s: %w", e.stag(), ErrMWBound)
	}
	e.gone, e.valid = true, false
	e.mem = mapping{}
	pd := e.pd
	mr.pd.dev.stags.release(e)
	e.mu.Unlock()
	pd.unref()
	return nil
}

// Invalidate moves a non-shared region to the Invalid state from the
// consumer's side without a work request (a privileged convenience used by
// targets that revoke a buffer the peer did not invalidate). It fails on
// shared regions and on regions with bound windows.
func (mr *MR) Invalidate() error {
	e := mr.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || e.shared {
		return fmt.Errorf("rnic: invalidate MR: %w", ErrInvalidSTag)
	}
	if e.mwCount > 0 {
		return fmt.Errorf("rnic: invalidate MR: %w", ErrMWBound)
	}
	e.valid = false
	return nil
}

// fastRegister executes a Fast-Register WR on qp (draft §7.3.2.5).
func (d *Device) fastRegister(qp *QP, fr *FastReg) Status {
	if fr == nil {
		return StatusInvalidWQE
	}
	if !qp.cfg.Privileged {
		return StatusNotPrivileged
	}
	e := d.stags.lookup(fr.STag)
	if e == nil {
		return StatusInvalidSTag
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || e.kind != kindMR || e.shared {
		return StatusInvalidSTag
	}
	if e.pd != qp.pd {
		return StatusInvalidPD
	}
	if e.valid {
		return StatusSTagNotInvalid
	}
	if !fr.Access.valid() || (fr.Access.Remote() && !e.remoteFlag) {
		return StatusInvalidAccessRights
	}
	if len(fr.Mem.Pages) > e.maxPBL {
		return StatusPBLTooLong
	}
	if st, err := e.setMapping(fr.Mem, fr.ZeroBased, fr.VA, e.maxPBL); err != nil {
		return st
	}
	e.access = fr.Access
	e.key = fr.STag.Key()
	e.valid = true
	return StatusSuccess
}
