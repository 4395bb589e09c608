package store

import "errors"

// ErrFenced is returned (wrapped) by the operations of a volume handle
// that another target took over: the shared store (Ceph RBD) refuses
// everything this handle sends from then on, writes in flight included. A
// target seeing it must stop serving the volume through this handle.
var ErrFenced = errors.New("volume fenced: another target took it over")

// Fencer is implemented by the volume handles of a store that several
// targets share, one serving a volume at a time (the rbd backend: several
// gateways in front of one Ceph cluster). Opening such a volume takes it
// over: the handle holds the volume's exclusive lock, any earlier holder
// is fenced (its operations fail with ErrFenced), and the volume's fencing
// epoch, kept with the volume in the shared store, is raised.
type Fencer interface {
	// FencingEpoch is the epoch this handle raised when it took the
	// volume over: larger than that of every earlier holder.
	FencingEpoch() uint64
	// Fenced is closed when the handle finds, by itself, that another
	// target took the volume over (before any operation failed with
	// ErrFenced, or without one).
	Fenced() <-chan struct{}
	// DurableID identifies the store the volume lives in, the same for
	// every target serving it and across their restarts: a write such a
	// store acknowledged is durable there (no volatile cache in the
	// target), so an initiator that moves to another target with the same
	// DurableID has lost no acknowledged write.
	DurableID() uint64
}

// devFencer is implemented by the block devices of a backend whose
// volumes are Fencers; the handles of such volumes are fencedVolumes.
type devFencer interface {
	fencingEpoch() uint64
	durableID() uint64
	fenced() <-chan struct{}
}

// fencedVolume is the handle of a volume whose device is a devFencer.
type fencedVolume struct{ *volume }

var _ Fencer = fencedVolume{}

func (v fencedVolume) FencingEpoch() uint64    { return v.dev.(devFencer).fencingEpoch() }
func (v fencedVolume) DurableID() uint64       { return v.dev.(devFencer).durableID() }
func (v fencedVolume) Fenced() <-chan struct{} { return v.dev.(devFencer).fenced() }

// exported is the Volume a Store hands out for handle v: a Fencer when
// its device is one, so callers find the ability by type assertion.
func exported(v *volume) Volume {
	if _, ok := v.dev.(devFencer); ok {
		return fencedVolume{v}
	}
	return v
}
