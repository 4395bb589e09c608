//go:build ceph

package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rnic-dev/rnic/internal/rbd"
)

// KindRBD is the Kind of the volumes of an rbd store.
const KindRBD = "rbd"

// Image metadata keys of an rbd store's volumes. The caller-defined Meta
// map lives under metaPrefix.
const (
	rbdKeyID    = "rtarget.id"    // the volume ID, decimal
	rbdKeyEpoch = "rtarget.epoch" // the fencing epoch, decimal
	rbdPrefix   = "rtarget.meta." // + a Meta key
)

// DefaultRBDTimeout is RBDOptions.Timeout's default: each cluster
// operation then has 30 s, above osd_heartbeat_grace +
// osd_heartbeat_interval (26 s by default), as tcmu-runner's rbd handler
// sets it, so that I/O waiting while the cluster marks a dead OSD down
// does not fail.
const DefaultRBDTimeout = 60 * time.Second

// RBDOptions configure OpenRBD.
type RBDOptions struct {
	ConfFile string // ceph.conf ("" = librados' default search)
	ID       string // Ceph client name without "client." ("" = admin)
	// Pool is "POOL" or "POOL/NAMESPACE": the store. The pool must exist
	// and be initialised for RBD; a missing namespace is created.
	Pool string
	// Timeout bounds a block request (0: DefaultRBDTimeout): a full or
	// unreachable cluster fails it with an error within Timeout instead of
	// hanging. A write is two cluster operations in a row (the object-map
	// update, then the data), so each operation is given Timeout/2
	// (rados_osd_op_timeout). The first write to an object of a clone
	// reads the parent's first: with every OSD unreachable it may take
	// 3/2 Timeout.
	Timeout time.Duration
	// CephOptions are extra librados/librbd options.
	CephOptions map[string]string
	Logger      *slog.Logger
}

// OpenRBD opens a store in front of Ceph RBD: a volume is an image of the
// pool (namespace), its record (ID, Meta, fencing epoch) lives in the
// image's metadata, and snapshots, clones, rollback and resize are RBD's
// own. Opening a volume takes it over (see Fencer): the handle holds the
// image's exclusive lock, a previous holder on another target is fenced,
// and the image's fencing epoch is raised. See the rbd section of the
// package documentation for what a crash may tear.
func OpenRBD(ctx context.Context, o RBDOptions) (Store, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultRBDTimeout
	}
	cfg := rbd.Config{ConfFile: o.ConfFile, ID: o.ID, Timeout: o.Timeout / 2, Options: o.CephOptions}
	conn, err := rbd.Connect(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: rbd: %w", err)
	}
	pool, err := conn.OpenPool(o.Pool, true)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("store: rbd: %w", rbdErr(err))
	}
	fsid, err := conn.FSID()
	if err != nil {
		pool.Close()
		conn.Close()
		return nil, fmt.Errorf("store: rbd: %w", err)
	}
	be := &rbdBackend{cfg: cfg, spec: o.Pool, conn: conn, pool: pool, fsid: fsid, log: o.Logger,
		heads: make(map[string]*rbdHead), opening: make(map[string]chan struct{})}
	return newVolumeStore(be), nil
}

// rbdErr maps the errors of package rbd onto this package's (keeping
// both).
func rbdErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rbd.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, rbd.ErrExists):
		return fmt.Errorf("%w: %w", ErrExists, err)
	case errors.Is(err, rbd.ErrBusy):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	case errors.Is(err, rbd.ErrLockLost):
		return fmt.Errorf("%w (the image is served by another target): %w", ErrBusy, err)
	}
	return err
}

// rbdBackend is the backend of OpenRBD.
type rbdBackend struct {
	cfg  rbd.Config
	spec string
	// conn and pool serve the catalog operations; every head has its own
	// connection (see rbdHead).
	conn *rbd.Conn
	pool *rbd.Pool
	fsid string
	log  *slog.Logger

	mu      sync.Mutex
	heads   map[string]*rbdHead      // open heads by volume name
	opening map[string]chan struct{} // heads being opened: closed when done
}

// withImage runs fn on the volume's image: the open head's if this store
// has one (it owns the exclusive lock, which the operations that change
// the image need: another handle would ask the owner, which refuses), a
// handle of its own otherwise.
func (b *rbdBackend) withImage(name string, fn func(im *rbd.Image) error) error {
	b.mu.Lock()
	h := b.heads[name]
	if h != nil {
		h.refs++ // keeps it open meanwhile
	}
	b.mu.Unlock()
	if h != nil {
		defer b.releaseHead(h)
		return rbdErr(fn(h.img))
	}
	im, err := b.pool.Open(name)
	if err != nil {
		return rbdErr(err)
	}
	err = fn(im)
	if cerr := im.Close(); err == nil {
		err = cerr
	}
	return rbdErr(err)
}

// readImage runs fn on a read-only handle of the volume's head.
func (b *rbdBackend) readImage(name string, fn func(im *rbd.Image) error) error {
	im, err := b.pool.OpenSnapshot(name, "")
	if err != nil {
		return rbdErr(err)
	}
	defer im.Close()
	return rbdErr(fn(im))
}

func (b *rbdBackend) createVolume(_ context.Context, info VolumeInfo, opts CreateOptions) (VolumeInfo, error) {
	if opts.Raw != "" {
		return VolumeInfo{}, fmt.Errorf("raw volumes in an rbd store: %w", ErrNotSupported)
	}
	if err := b.pool.Create(info.Name, uint64(info.Size)); err != nil {
		return VolumeInfo{}, rbdErr(err)
	}
	out, err := b.initRecord(info.Name, info.Meta)
	if err != nil {
		if rerr := b.pool.Remove(info.Name); rerr != nil {
			b.log.Error("removing a half-created image", "image", info.Name, "err", rerr)
		}
		return VolumeInfo{}, err
	}
	return out, nil
}

// initRecord gives a new image (or clone) its ID and Meta and returns its
// record.
func (b *rbdBackend) initRecord(name string, meta map[string]string) (VolumeInfo, error) {
	id, err := b.pool.NextID()
	if err != nil {
		return VolumeInfo{}, err
	}
	var info VolumeInfo
	err = b.withImage(name, func(im *rbd.Image) error {
		if err := im.SetMetadata(rbdKeyID, strconv.FormatUint(uint64(id), 10)); err != nil {
			return err
		}
		for k, v := range meta {
			if err := im.SetMetadata(rbdPrefix+k, v); err != nil {
				return err
			}
		}
		info, err = b.record(im, name)
		return err
	})
	return info, err
}

// record reads the identity fields of a volume from its image.
func (b *rbdBackend) record(im *rbd.Image, name string) (VolumeInfo, error) {
	size, err := im.Size()
	if err != nil {
		return VolumeInfo{}, err
	}
	created, err := im.Created()
	if err != nil {
		return VolumeInfo{}, err
	}
	md, err := im.AllMetadata()
	if err != nil {
		return VolumeInfo{}, err
	}
	info := VolumeInfo{Name: name, Size: int64(size), Created: created, Kind: KindRBD, Meta: map[string]string{}}
	for k, v := range md {
		if mk, ok := strings.CutPrefix(k, rbdPrefix); ok {
			info.Meta[mk] = v
		}
	}
	if id, err := strconv.ParseUint(md[rbdKeyID], 10, 32); err == nil && id != 0 {
		info.ID = uint32(id)
	} else {
		// An image made outside rtarget (rbd create): an ID derived from
		// RBD's own image ID, stable, non-zero.
		imgID, err := im.ID()
		if err != nil {
			return VolumeInfo{}, err
		}
		h := fnv.New32a()
		h.Write([]byte(imgID))
		info.ID = h.Sum32() | 1<<31
	}
	par, ok, err := im.Parent()
	if err != nil {
		return VolumeInfo{}, err
	}
	if ok {
		info.Origin = b.volumeName(par.Pool, par.Image) + "@" + par.Snap
	}
	return info, nil
}

// volumeName names an image as a volume: its name within this store's
// pool (namespace), "pool[/ns]/image" for an image elsewhere.
func (b *rbdBackend) volumeName(pool, image string) string {
	if pool == b.spec {
		return image
	}
	return pool + "/" + image
}

func (b *rbdBackend) getVolume(_ context.Context, name string) (VolumeInfo, error) {
	var info VolumeInfo
	err := b.readImage(name, func(im *rbd.Image) error {
		var err error
		info, err = b.record(im, name)
		return err
	})
	return info, err
}

func (b *rbdBackend) statVolume(_ context.Context, name string) (VolumeInfo, error) {
	var info VolumeInfo
	err := b.readImage(name, func(im *rbd.Image) error {
		var err error
		if info, err = b.record(im, name); err != nil {
			return err
		}
		return b.space(im, &info)
	})
	return info, err
}

func (b *rbdBackend) listVolumes(ctx context.Context) ([]VolumeInfo, error) {
	names, err := b.pool.List()
	if err != nil {
		return nil, rbdErr(err)
	}
	infos := make([]VolumeInfo, 0, len(names))
	for _, n := range names {
		info, err := b.statVolume(ctx, n)
		if errors.Is(err, ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("image %q: %w", n, err)
		}
		infos = append(infos, info)
	}
	return infos, nil
}

func (b *rbdBackend) deleteVolume(_ context.Context, info VolumeInfo) error {
	err := b.withImage(info.Name, func(im *rbd.Image) error {
		snaps, err := im.Snapshots()
		if err != nil {
			return err
		}
		for _, s := range snaps {
			kids, err := im.Children(s.Name)
			if err != nil {
				return err
			}
			if len(kids) > 0 {
				return fmt.Errorf("snapshot %s@%s has clones %v: %w", info.Name, s.Name, kids, ErrHasDependents)
			}
		}
		for _, s := range snaps {
			if err := im.RemoveSnapshot(s.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return rbdErr(b.pool.Remove(info.Name))
}

func (b *rbdBackend) resizeVolume(_ context.Context, info VolumeInfo, size int64, _ bool) error {
	return b.withImage(info.Name, func(im *rbd.Image) error {
		if err := im.Resize(uint64(size)); err != nil {
			return err
		}
		b.mu.Lock()
		if h := b.heads[info.Name]; h != nil {
			h.size.Store(uint64(size))
		}
		b.mu.Unlock()
		return nil
	})
}

func (b *rbdBackend) createSnapshot(_ context.Context, info VolumeInfo, snap string) (SnapshotInfo, error) {
	var si SnapshotInfo
	err := b.withImage(info.Name, func(im *rbd.Image) error {
		if err := im.CreateSnapshot(snap); err != nil {
			return err
		}
		snaps, err := im.Snapshots()
		if err != nil {
			return err
		}
		for _, s := range snaps {
			if s.Name == snap {
				si = SnapshotInfo{Name: s.Name, Created: s.Created, Size: int64(s.Size)}
				return nil
			}
		}
		return fmt.Errorf("snapshot %s@%s vanished after its creation: %w", info.Name, snap, ErrNotFound)
	})
	return si, err
}

func (b *rbdBackend) deleteSnapshot(_ context.Context, info VolumeInfo, snap string) error {
	return b.withImage(info.Name, func(im *rbd.Image) error {
		err := im.RemoveSnapshot(snap)
		if errors.Is(err, rbd.ErrBusy) {
			return fmt.Errorf("%w: %w", ErrHasDependents, err)
		}
		return err
	})
}

func (b *rbdBackend) clone(_ context.Context, origin VolumeInfo, snap string, info VolumeInfo) (VolumeInfo, error) {
	if err := b.pool.Clone(origin.Name, snap, info.Name); err != nil {
		return VolumeInfo{}, rbdErr(err)
	}
	out, err := b.initRecord(info.Name, info.Meta)
	if err != nil {
		if rerr := b.pool.Remove(info.Name); rerr != nil {
			b.log.Error("removing a half-created clone", "image", info.Name, "err", rerr)
		}
		return VolumeInfo{}, err
	}
	return out, nil
}

func (b *rbdBackend) rollback(_ context.Context, info VolumeInfo, snap string) error {
	return b.withImage(info.Name, func(im *rbd.Image) error { return im.Rollback(snap) })
}

func (b *rbdBackend) setMeta(_ context.Context, info VolumeInfo, meta map[string]string) error {
	return b.withImage(info.Name, func(im *rbd.Image) error {
		md, err := im.AllMetadata()
		if err != nil {
			return err
		}
		for k := range maps.Keys(md) {
			if mk, ok := strings.CutPrefix(k, rbdPrefix); ok {
				if _, keep := meta[mk]; !keep {
					if err := im.RemoveMetadata(k); err != nil {
						return err
					}
				}
			}
		}
		for k, v := range meta {
			if err := im.SetMetadata(rbdPrefix+k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *rbdBackend) sync(context.Context) error {
	// rbd_cache is off: every acknowledged write is on every replica.
	b.mu.Lock()
	heads := make([]*rbdHead, 0, len(b.heads))
	for _, h := range b.heads {
		heads = append(heads, h)
	}
	b.mu.Unlock()
	var errs []error
	for _, h := range heads {
		errs = append(errs, rbdDevErr(h.img.Flush()))
	}
	return errors.Join(errs...)
}

func (b *rbdBackend) close() error {
	b.pool.Close()
	b.conn.Close()
	return nil
}
