package rnic

import "fmt"

// PD is a protection domain (draft §5.2). QPs, S-RQs, memory regions and
// memory windows each belong to exactly one PD; a remote access through a
// region succeeds only from a QP of the same PD.
type PD struct {
	dev  *Device
	id   uint32
	refs int // QPs, S-RQs, MRs, MWs (under dev.mu)
	dead bool
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if len(d.pds) >= d.cfg.MaxPD {
		return nil, fmt.Errorf("rnic: allocate PD: %w", ErrInsufficientResources)
	}
	d.nextPDID++
	pd := &PD{dev: d, id: d.nextPDID}
	d.pds[pd] = struct{}{}
	return pd, nil
}

// ID is the PD's identifier, unique within its device.
func (pd *PD) ID() uint32 { return pd.id }

// Device returns the PD's device.
func (pd *PD) Device() *Device { return pd.dev }

// Dealloc frees the PD. It fails with ErrPDInUse while any QP, S-RQ, region
// or window references it.
func (pd *PD) Dealloc() error {
	d := pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd.dead {
		return fmt.Errorf("rnic: deallocate PD %d: %w", pd.id, ErrInvalidPD)
	}
	if pd.refs > 0 {
		return fmt.Errorf("rnic: deallocate PD %d (%d users): %w", pd.id, pd.refs, ErrPDInUse)
	}
	pd.dead = true
	delete(d.pds, pd)
	return nil
}

// ref takes a reference for a new user of the PD.
func (pd *PD) ref() error {
	d := pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if pd.dead {
		return fmt.Errorf("rnic: PD %d: %w", pd.id, ErrInvalidPD)
	}
	pd.refs++
	return nil
}

func (pd *PD) unref() {
	pd.dev.mu.Lock()
	pd.refs--
	pd.dev.mu.Unlock()
}
