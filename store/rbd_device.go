//go:build ceph

package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/internal/rbd"
)

// objStripes is the number of range-lock stripes of a head: a request
// spanning several RADOS objects locks the stripes of its objects.
const objStripes = 64

// rbdHead is a volume's image opened for I/O, shared by every handle of
// this store on the volume. It has its own connection (librados client
// instance), because taking a volume over blocklists the previous holder's
// instance: only this image's, never the other volumes of the target.
type rbdHead struct {
	b       *rbdBackend
	name    string
	conn    *rbd.Conn
	pool    *rbd.Pool
	img     *rbd.Image
	refs    int // under b.mu
	epoch   uint64
	durable uint64
	size    atomic.Uint64 // bytes
	// sizeAt is when size was last read from librbd (unix ns): a resize
	// another client asked for is carried out by this handle (it owns the
	// lock), so librbd knows the new size; size follows within a second.
	sizeAt atomic.Int64

	// fenced is closed once the head finds it lost the volume (see
	// watchLock, and close's last look); stop ends watchLock. served is
	// set once takeOver holds the lock and the head is handed out.
	served    bool
	fenced    chan struct{}
	fenceOnce sync.Once
	stop      chan struct{}
	stopOnce  sync.Once

	// A request within one RADOS object is atomic by itself (RADOS applies
	// an operation on one object atomically and in order); one spanning
	// several takes these, exclusively to write, shared to read, so that a
	// reader or writer never sees half of another request.
	stripes [objStripes]sync.RWMutex
}

// openHead returns the head of volume name, opening it (and taking the
// volume over) on first use. Concurrent first opens of one volume wait for
// one take-over: two would blocklist each other.
func (b *rbdBackend) openHead(ctx context.Context, name string) (*rbdHead, error) {
	for {
		b.mu.Lock()
		if h := b.heads[name]; h != nil {
			h.refs++
			b.mu.Unlock()
			return h, nil
		}
		wait, busy := b.opening[name]
		if !busy {
			break // b.mu held
		}
		b.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	done := make(chan struct{})
	b.opening[name] = done
	b.mu.Unlock()
	h, err := b.takeOver(ctx, name)
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.opening, name)
	close(done)
	if err != nil {
		return nil, err
	}
	h.refs = 1
	b.heads[name] = h
	return h, nil
}

// takeOver connects, opens the image, takes its exclusive lock (breaking,
// and so fencing, any other holder) and raises its fencing epoch.
func (b *rbdBackend) takeOver(ctx context.Context, name string) (*rbdHead, error) {
	conn, err := rbd.Connect(ctx, b.cfg)
	if err != nil {
		return nil, err
	}
	h := &rbdHead{b: b, name: name, conn: conn, fenced: make(chan struct{}), stop: make(chan struct{})}
	if h.pool, err = conn.OpenPool(b.spec, false); err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	if h.img, err = h.pool.Open(name); err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	broken, err := h.img.TakeOverLock()
	if err != nil {
		h.close()
		return nil, fmt.Errorf("taking the exclusive lock of %s/%s: %w", b.spec, name, rbdErr(err))
	}
	if len(broken) > 0 {
		b.log.Warn("took the volume over: broke the exclusive lock of the previous holder, which is now blocklisted",
			"volume", name, "previous", broken)
	}
	v, _, err := h.img.Metadata(rbdKeyEpoch)
	if err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	epoch, _ := strconv.ParseUint(v, 10, 64)
	h.epoch = epoch + 1
	if err := h.img.SetMetadata(rbdKeyEpoch, strconv.FormatUint(h.epoch, 10)); err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	size, err := h.img.Size()
	if err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	h.size.Store(size)
	imgID, err := h.img.ID()
	if err != nil {
		h.close()
		return nil, rbdErr(err)
	}
	f := fnv.New64a()
	fmt.Fprintf(f, "%s/%s/%s", b.fsid, b.spec, imgID)
	h.durable = f.Sum64() | 1
	b.log.Info("serving volume", "volume", name, "pool", b.spec, "fencing_epoch", h.epoch)
	h.served = true
	go h.watchLock()
	return h, nil
}

// close releases everything the head holds (the lock with the image).
// A head that served the volume first looks once more whether it was
// taken over (checkLock): the last session may have ended (its initiator
// moved to the target that took over) before watchLock's next look, and a
// target must still learn, and report, that it was fenced.
func (h *rbdHead) close() error {
	if h.served {
		select {
		case <-h.fenced:
		default:
			h.checkLock()
		}
	}
	h.stopOnce.Do(func() { close(h.stop) })
	var err error
	if h.img != nil {
		err = h.img.Close()
	}
	if h.pool != nil {
		h.pool.Close()
	}
	h.conn.Close()
	return err
}

// lockCheckInterval is how often a head asks the cluster who owns its
// image's lock.
const lockCheckInterval = time.Second

// watchLock finds out, without waiting for a request to fail, that another
// gateway took the volume over: every lockCheckInterval it reads the lock's
// owners from the cluster (a blocklisted client's reads are refused too,
// with ErrFenced) and asks librbd whether this handle still owns it. A
// gateway that was stopped (SIGSTOP) and continued thus learns it was
// fenced within a second or two, whether or not it had requests in flight.
func (h *rbdHead) watchLock() {
	t := time.NewTicker(lockCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		if h.checkLock() {
			return
		}
	}
}

// checkLock reads the lock's owners from the cluster and asks librbd
// whether this handle still owns it; when another client took it (or this
// one was blocklisted) it marks the head fenced and reports true. A cluster
// that is slow or away is not taken for a loss: requests report that.
func (h *rbdHead) checkLock() (fenced bool) {
	owners, err := h.img.LockOwners()
	if errors.Is(err, rbd.ErrFenced) {
		h.markFenced(err)
		return true
	}
	if err != nil {
		return false
	}
	if own, err := h.img.IsLockOwner(); err == nil && !own {
		h.markFenced(fmt.Errorf("the exclusive lock of %s/%s is owned by %v: %w", h.b.spec, h.name, owners, rbd.ErrLockLost))
		return true
	}
	return false
}

func (h *rbdHead) markFenced(err error) {
	h.fenceOnce.Do(func() {
		h.b.log.Warn("volume taken over by another gateway: this one is fenced", "volume", h.name, "err", err)
		close(h.fenced)
	})
}

// releaseHead drops one reference; the last closes the head.
func (b *rbdBackend) releaseHead(h *rbdHead) error {
	b.mu.Lock()
	h.refs--
	last := h.refs == 0
	if last && b.heads[h.name] == h {
		delete(b.heads, h.name)
	}
	b.mu.Unlock()
	if !last {
		return nil
	}
	return rbdDevErr(h.close())
}

// rbdDevErr maps the errors of I/O on an image: a fenced handle, or one
// whose lock another client holds, is ErrFenced.
func rbdDevErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rbd.ErrFenced), errors.Is(err, rbd.ErrLockLost):
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return err
}

// lockRange locks the stripes of the objects of [off, off+n) when the
// range spans more than one object, and returns the unlock.
func (h *rbdHead) lockRange(off, n uint64, write bool) func() {
	first, last := off>>rbd.ObjectOrder, (off+n-1)>>rbd.ObjectOrder
	if first == last {
		return func() {}
	}
	var set [objStripes]bool
	if last-first+1 >= objStripes {
		for i := range set {
			set[i] = true
		}
	} else {
		for o := first; o <= last; o++ {
			set[o%objStripes] = true
		}
	}
	for i, in := range set {
		if !in {
			continue
		}
		if write {
			h.stripes[i].Lock()
		} else {
			h.stripes[i].RLock()
		}
	}
	return func() {
		for i, in := range set {
			if !in {
				continue
			}
			if write {
				h.stripes[i].Unlock()
			} else {
				h.stripes[i].RUnlock()
			}
		}
	}
}

func (b *rbdBackend) open(ctx context.Context, info VolumeInfo, snap string) (blockDevice, VolumeInfo, error) {
	if snap != "" {
		im, err := b.pool.OpenSnapshot(info.Name, snap)
		if err != nil {
			return nil, VolumeInfo{}, rbdErr(err)
		}
		snaps, err := im.Snapshots()
		if err != nil {
			im.Close()
			return nil, VolumeInfo{}, rbdErr(err)
		}
		vi := info.clone()
		vi.Name, vi.ReadOnly = info.Name+"@"+snap, true
		for _, s := range snaps {
			if s.Name == snap {
				vi.Size, vi.Created = int64(s.Size), s.Created
			}
		}
		return &rbdSnapDevice{img: im, size: uint64(vi.Size)}, vi, nil
	}
	h, err := b.openHead(ctx, info.Name)
	if err != nil {
		return nil, VolumeInfo{}, err
	}
	vi := info.clone()
	vi.Size = int64(h.size.Load())
	return &rbdDevice{h: h}, vi, nil
}

// rbdDevice is one handle's view of a head.
type rbdDevice struct {
	h        *rbdHead
	released atomic.Bool
}

// rbdDevice is the device of a volume several targets serve in turn.
var _ devFencer = (*rbdDevice)(nil)

func (d *rbdDevice) fencingEpoch() uint64    { return d.h.epoch }
func (d *rbdDevice) fenced() <-chan struct{} { return d.h.fenced }
func (d *rbdDevice) durableID() uint64       { return d.h.durable }

func (d *rbdDevice) blocks() uint64 {
	h := d.h
	if now := time.Now().UnixNano(); now-h.sizeAt.Load() > int64(time.Second) {
		h.sizeAt.Store(now)
		if size, err := h.img.Size(); err == nil {
			h.size.Store(size)
		}
	}
	return h.size.Load() / BlockSize
}

func (d *rbdDevice) read(_ context.Context, lba uint64, dst []byte) error {
	off := lba * BlockSize
	defer d.h.lockRange(off, uint64(len(dst)), false)()
	return rbdDevErr(d.h.img.ReadAt(dst, int64(off)))
}

// write: with rbd_cache off the write is on every replica when librbd
// acknowledges it, so FUA needs nothing more.
func (d *rbdDevice) write(_ context.Context, lba uint64, src []byte, _ bool) error {
	off := lba * BlockSize
	defer d.h.lockRange(off, uint64(len(src)), true)()
	return rbdDevErr(d.h.img.WriteAt(src, int64(off)))
}

// discard: rbd_discard with 4 KiB granularity and partial discards not
// skipped (see package rbd) zeroes every block of the range, removing the
// objects it covers whole.
func (d *rbdDevice) discard(_ context.Context, lba, count uint64, _ bool) error {
	off, n := lba*BlockSize, count*BlockSize
	defer d.h.lockRange(off, n, true)()
	return rbdDevErr(d.h.img.Discard(off, n))
}

func (d *rbdDevice) flush(context.Context) error { return rbdDevErr(d.h.img.Flush()) }

func (d *rbdDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	return rbdBlockStatus(ctx, d.h.img, lba, count, fn)
}

func (d *rbdDevice) release() error {
	if !d.released.CompareAndSwap(false, true) {
		return nil
	}
	return d.h.b.releaseHead(d.h)
}

// rbdSnapDevice is a snapshot opened read-only.
type rbdSnapDevice struct {
	img  *rbd.Image
	size uint64
}

func (d *rbdSnapDevice) blocks() uint64 { return d.size / BlockSize }
func (d *rbdSnapDevice) read(_ context.Context, lba uint64, dst []byte) error {
	return rbdDevErr(d.img.ReadAt(dst, int64(lba*BlockSize)))
}
func (d *rbdSnapDevice) write(context.Context, uint64, []byte, bool) error { return ErrReadOnly }
func (d *rbdSnapDevice) discard(context.Context, uint64, uint64, bool) error {
	return ErrReadOnly
}
func (d *rbdSnapDevice) flush(context.Context) error { return nil }
func (d *rbdSnapDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	return rbdBlockStatus(ctx, d.img, lba, count, fn)
}
func (d *rbdSnapDevice) release() error { return rbdDevErr(d.img.Close()) }

// errStop ends a diff iteration early.
var errStop = errors.New("stop")

// rbdBlockStatus reports allocation from librbd's diff against nothing
// (parent data of a clone included): what it does not report is a hole.
func rbdBlockStatus(ctx context.Context, im *rbd.Image, lba, count uint64, fn func(Extent) bool) error {
	r := extentRun{fn: fn}
	next := lba
	err := im.Allocated(lba*BlockSize, count*BlockSize, func(e rbd.Extent) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		first := e.Offset / BlockSize
		end := (e.Offset + e.Length + BlockSize - 1) / BlockSize
		first, end = max(first, next), min(end, lba+count)
		if end <= first {
			return nil
		}
		if !r.add(next, first-next, true) || !r.add(first, end-first, !e.Exists) {
			return errStop
		}
		next = end
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	if err != nil {
		return rbdDevErr(err)
	}
	if !r.add(next, lba+count-next, true) {
		return nil
	}
	r.done()
	return nil
}
