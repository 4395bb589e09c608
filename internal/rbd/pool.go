//go:build ceph

package rbd

import (
	"errors"
	"sort"

	"github.com/ceph/go-ceph/rbd"
)

// ObjectOrder is the log2 of the objects images are striped over (4 MiB,
// RBD's default): the unit RADOS writes atomically.
const ObjectOrder = 22

// Create makes an image of size bytes with RBD's default features
// (layering, exclusive-lock, object-map, fast-diff, deep-flatten).
func (p *Pool) Create(name string, size uint64) error {
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionOrder, ObjectOrder); err != nil {
		return wrap("create", p.where(name), err)
	}
	return wrap("create", p.where(name), rbd.CreateImage(p.ioctx, name, size, opts))
}

// Remove deletes an image. It fails with ErrBusy while the image is open
// by any client (it has watchers) or has snapshots.
func (p *Pool) Remove(name string) error {
	return wrap("remove", p.where(name), rbd.RemoveImage(p.ioctx, name))
}

// List returns the names of the pool's (namespace's) images, sorted.
func (p *Pool) List() ([]string, error) {
	names, err := rbd.GetImageNames(p.ioctx)
	if err != nil {
		return nil, wrap("list", p.spec, err)
	}
	sort.Strings(names)
	return names, nil
}

// Clone makes child a clone of parent@snap in the same pool.
func (p *Pool) Clone(parent, snap, child string) error {
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionOrder, ObjectOrder); err != nil {
		return wrap("clone", p.where(child), err)
	}
	return wrap("clone", p.where(child), rbd.CloneImage(p.ioctx, parent, snap, p.ioctx, child, opts))
}

// Open opens an image for reading and writing.
func (p *Pool) Open(name string) (*Image, error) {
	img, err := rbd.OpenImage(p.ioctx, name, rbd.NoSnapshot)
	if err != nil {
		return nil, wrap("open", p.where(name), err)
	}
	return &Image{img: img, pool: p, name: name, where: p.where(name)}, nil
}

// OpenSnapshot opens an image read-only at a snapshot ("" = its head).
func (p *Pool) OpenSnapshot(name, snap string) (*Image, error) {
	if snap == "" {
		snap = rbd.NoSnapshot
	}
	img, err := rbd.OpenImageReadOnly(p.ioctx, name, snap)
	if err != nil {
		return nil, wrap("open read-only", p.where(name)+"@"+snap, err)
	}
	return &Image{img: img, pool: p, name: name, where: p.where(name), readOnly: true}, nil
}

// Exists reports whether an image of that name exists.
func (p *Pool) Exists(name string) (bool, error) {
	img, err := p.OpenSnapshot(name, "")
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, img.Close()
}
