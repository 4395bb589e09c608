//go:build ceph

package rbd

import (
	"errors"
	"time"
)

// Snapshot describes one snapshot of an image.
type Snapshot struct {
	ID      uint64
	Name    string
	Size    uint64 // the image's size when it was taken
	Created time.Time
}

// Snapshots lists the image's snapshots, oldest first.
func (im *Image) Snapshots() ([]Snapshot, error) {
	infos, err := im.img.GetSnapshotNames()
	if err != nil {
		return nil, wrap("snapshot list", im.where, err)
	}
	out := make([]Snapshot, 0, len(infos))
	for _, si := range infos {
		ts, err := im.img.GetSnapTimestamp(si.Id)
		if err != nil {
			return nil, wrap("snapshot timestamp "+si.Name, im.where, err)
		}
		out = append(out, Snapshot{ID: si.Id, Name: si.Name, Size: si.Size, Created: time.Unix(ts.Sec, ts.Nsec).UTC()})
	}
	return out, nil
}

// CreateSnapshot takes a snapshot (crash-consistent: librbd quiesces the
// image's in-flight writes first).
func (im *Image) CreateSnapshot(name string) error {
	_, err := im.img.CreateSnapshot(name)
	return wrap("snapshot create "+name, im.where, err)
}

// RemoveSnapshot removes a snapshot. It fails with ErrBusy while clones of
// it exist.
func (im *Image) RemoveSnapshot(name string) error {
	snap := im.img.GetSnapshot(name)
	if kids, err := im.Children(name); err != nil {
		return err
	} else if len(kids) > 0 {
		return &Error{Op: "snapshot remove " + name, Image: im.where, Errno: 16, Err: ErrBusy}
	}
	return wrap("snapshot remove "+name, im.where, snap.Remove())
}

// Rollback returns the image to a snapshot.
func (im *Image) Rollback(name string) error {
	return wrap("snapshot rollback "+name, im.where, im.img.GetSnapshot(name).Rollback())
}

// Children lists the clones of snapshot name, as "pool[/ns]/image".
func (im *Image) Children(name string) ([]string, error) {
	snapImg, err := im.pool.OpenSnapshot(im.name, name)
	if err != nil {
		return nil, err
	}
	defer snapImg.Close()
	specs, err := snapImg.img.ListChildrenAttributes()
	if err != nil {
		err = wrap("list children "+name, im.where, err)
		if errors.Is(err, ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, s := range specs {
		if s.Trash {
			continue
		}
		p := s.PoolName
		if s.PoolNamespace != "" {
			p += "/" + s.PoolNamespace
		}
		out = append(out, p+"/"+s.ImageName)
	}
	return out, nil
}

// Parent is the snapshot a clone was made from.
type Parent struct {
	Pool  string // "pool[/ns]"
	Image string
	Snap  string
}

// Parent returns the image's parent; ok is false for an image that is no
// clone (or was flattened).
func (im *Image) Parent() (p Parent, ok bool, err error) {
	info, err := im.img.GetParent()
	if err != nil {
		err = wrap("parent", im.where, err)
		if errors.Is(err, ErrNotFound) {
			return Parent{}, false, nil
		}
		return Parent{}, false, err
	}
	pool := info.Image.PoolName
	if info.Image.PoolNamespace != "" {
		pool += "/" + info.Image.PoolNamespace
	}
	return Parent{Pool: pool, Image: info.Image.ImageName, Snap: info.Snap.SnapName}, true, nil
}
