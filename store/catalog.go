package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest volume or snapshot name accepted, in bytes.
const MaxNameLen = 255

// MaxMetaLen is the most bytes of keys and values a volume's Meta may hold.
const MaxMetaLen = 64 << 10

// volumeStore implements Store on top of a backend.
type volumeStore struct {
	be backend

	mu     sync.Mutex
	closed bool
	// open holds the open handles by volume name; a snapshot handle counts
	// under its volume too (snapOpen has them by "VOL@SNAP").
	open     map[string]map[*volume]struct{}
	snapOpen map[string]int
	// excl holds the volumes an exclusive operation (delete, rollback,
	// shrink) is working on, and as "VOL@SNAP" the snapshots being deleted:
	// opens and other exclusive operations on them fail with ErrBusy
	// meanwhile. The value names the operation.
	excl map[string]string
	ops  sync.WaitGroup // store-level calls in flight

	// resizing serializes what changes a volume's size, resizes and
	// rollbacks: a grow runs beside open handles, so without it two grows
	// (or a grow and a rollback) could land in either order, the smaller
	// last, and that one would cut what the other had just made visible.
	// It is a one-slot semaphore rather than a mutex so that a caller
	// waiting behind a long rollback or shrink can give up with its ctx.
	resizing chan struct{}
}

func newVolumeStore(be backend) *volumeStore {
	return &volumeStore{
		be:       be,
		open:     make(map[string]map[*volume]struct{}),
		snapOpen: make(map[string]int),
		excl:     make(map[string]string),
		resizing: make(chan struct{}, 1),
	}
}

// lockResize takes s.resizing, or fails when ctx ends first.
func (s *volumeStore) lockResize(ctx context.Context) error {
	select {
	case s.resizing <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another resize or rollback: %w", ctx.Err())
	}
}

func (s *volumeStore) unlockResize() { <-s.resizing }

// enter registers a store-level call; it fails once Close has begun or if
// ctx is done. The caller calls s.ops.Done.
func (s *volumeStore) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops.Add(1)
	return nil
}

// checkName accepts a name for a new volume or snapshot.
func checkName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty %s name: %w", what, ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%s name longer than %d bytes: %w", what, MaxNameLen, ErrInvalid)
	case !utf8.ValidString(name):
		return fmt.Errorf("%s name %q is not UTF-8: %w", what, name, ErrInvalid)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%s name %q contains control characters: %w", what, name, ErrInvalid)
	case strings.ContainsAny(name, "@/"):
		return fmt.Errorf("%s name %q contains '@' or '/': %w", what, name, ErrInvalid)
	}
	return nil
}

// SplitSnapshot splits "VOL@SNAP" into VOL and SNAP; a name without '@'
// returns snap "". It checks nothing: ParseRef does.
func SplitSnapshot(name string) (vol, snap string) {
	vol, snap, _ = strings.Cut(name, "@")
	return vol, snap
}

// ParseRef parses a reference to a volume, NAME, or to one of its
// snapshots, NAME@SNAP. With an '@', both sides must be there: "disk1@"
// (say, "disk1@$SNAP" with SNAP unset) is an error (ErrInvalid), never
// disk1 itself, which would make a delete of a snapshot delete the volume
// and an export meant read-only writable.
func ParseRef(ref string) (vol, snap string, err error) {
	vol, snap, at := strings.Cut(ref, "@")
	if at && (vol == "" || snap == "" || strings.Contains(snap, "@")) {
		return "", "", fmt.Errorf("want NAME or NAME@SNAP, neither empty: %w", ErrInvalid)
	}
	return vol, snap, nil
}

// checkMeta accepts UTF-8 keys and values (so they survive the JSON of a
// stored record unchanged), MaxMetaLen bytes in all.
func checkMeta(meta map[string]string) error {
	n := 0
	for k, v := range meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("volume meta %q is not UTF-8: %w", k, ErrInvalid)
		}
		n += len(k) + len(v)
	}
	if n > MaxMetaLen {
		return fmt.Errorf("volume meta of %d bytes, limit %d: %w", n, MaxMetaLen, ErrInvalid)
	}
	return nil
}

func checkSize(size int64) error {
	if size <= 0 || size%BlockSize != 0 {
		return fmt.Errorf("size %d is not a positive multiple of %d: %w", size, BlockSize, ErrInvalid)
	}
	return nil
}

// newInfo returns the record of a new volume before the backend assigns
// its id; Meta is the caller's copy.
func newInfo(name string, size int64, meta map[string]string) VolumeInfo {
	vi := VolumeInfo{Name: name, Size: size, Created: time.Now().UTC(), Meta: meta}
	return vi.clone()
}

func (s *volumeStore) CreateVolume(ctx context.Context, name string, size int64, opts CreateOptions) (VolumeInfo, error) {
	info, err := s.createVolume(ctx, name, size, opts)
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("store: create volume %q: %w", name, err)
	}
	return info, nil
}

func (s *volumeStore) createVolume(ctx context.Context, name string, size int64, opts CreateOptions) (VolumeInfo, error) {
	if err := checkName("volume", name); err != nil {
		return VolumeInfo{}, err
	}
	if err := checkMeta(opts.Meta); err != nil {
		return VolumeInfo{}, err
	}
	if opts.Raw == "" || size != 0 {
		if err := checkSize(size); err != nil {
			return VolumeInfo{}, err
		}
	}
	if err := s.enter(ctx); err != nil {
		return VolumeInfo{}, err
	}
	defer s.ops.Done()
	if op := s.exclusiveOp(name); op != "" {
		return VolumeInfo{}, fmt.Errorf("%s in progress: %w", op, ErrBusy)
	}
	info, err := s.be.createVolume(ctx, newInfo(name, size, opts.Meta), opts)
	if err != nil {
		return VolumeInfo{}, err
	}
	return info.clone(), nil
}

func (s *volumeStore) exclusiveOp(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.excl[name]
}

func (s *volumeStore) OpenVolume(ctx context.Context, name string) (Volume, error) {
	v, err := s.openVolume(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("store: open volume %q: %w", name, err)
	}
	return v, nil
}

func (s *volumeStore) openVolume(ctx context.Context, name string) (Volume, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	volName, snap, err := ParseRef(name)
	if err != nil {
		return nil, err
	}
	// Register the handle before looking the volume up, so an exclusive
	// operation starting meanwhile sees it and fails with ErrBusy.
	v := &volume{store: s, name: volName, ref: name}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	op := s.excl[volName]
	if op == "" && snap != "" {
		op = s.excl[name] // the snapshot's deletion
	}
	if op != "" {
		s.mu.Unlock()
		return nil, fmt.Errorf("%s in progress: %w", op, ErrBusy)
	}
	hs := s.open[volName]
	if hs == nil {
		hs = make(map[*volume]struct{})
		s.open[volName] = hs
	}
	hs[v] = struct{}{}
	if snap != "" {
		s.snapOpen[name]++
	}
	s.mu.Unlock()

	info, err := s.be.getVolume(ctx, volName)
	if err == nil {
		v.dev, v.info, err = s.be.open(ctx, info, snap)
	}
	if err != nil {
		s.release(v)
		return nil, err
	}
	return exported(v), nil
}

// release forgets a closed handle.
func (s *volumeStore) release(v *volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := s.open[v.name]
	delete(hs, v)
	if len(hs) == 0 {
		delete(s.open, v.name)
	}
	if v.ref != v.name {
		if s.snapOpen[v.ref]--; s.snapOpen[v.ref] <= 0 {
			delete(s.snapOpen, v.ref)
		}
	}
}

func (s *volumeStore) StatVolume(ctx context.Context, name string) (VolumeInfo, error) {
	if err := s.enter(ctx); err != nil {
		return VolumeInfo{}, fmt.Errorf("store: stat volume %q: %w", name, err)
	}
	defer s.ops.Done()
	info, err := s.be.statVolume(ctx, name)
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("store: stat volume %q: %w", name, err)
	}
	return info.clone(), nil
}

func (s *volumeStore) ListVolumes(ctx context.Context) ([]VolumeInfo, error) {
	if err := s.enter(ctx); err != nil {
		return nil, fmt.Errorf("store: list volumes: %w", err)
	}
	defer s.ops.Done()
	infos, err := s.be.listVolumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: list volumes: %w", err)
	}
	slices.SortFunc(infos, func(a, b VolumeInfo) int { return strings.Compare(a.Name, b.Name) })
	for i := range infos {
		infos[i] = infos[i].clone()
	}
	return infos, nil
}

// exclusive runs fn as an exclusive operation op on volume name: it fails
// with ErrBusy while handles on the volume are open (busy reports which
// count) or another exclusive operation runs, and keeps opens out while fn
// runs.
func (s *volumeStore) exclusive(ctx context.Context, name, op string, busy func(handles, snapHandles int) bool,
	fn func(info VolumeInfo) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.ops.Done()
	s.mu.Lock()
	if cur := s.excl[name]; cur != "" {
		s.mu.Unlock()
		return fmt.Errorf("%s already in progress: %w", cur, ErrBusy)
	}
	n, snaps := len(s.open[name]), 0
	for ref, c := range s.snapOpen {
		if v, _ := SplitSnapshot(ref); v == name {
			snaps += c
		}
	}
	if busy(n-snaps, snaps) {
		s.mu.Unlock()
		if snaps > 0 {
			return fmt.Errorf("%d open handles (%d on snapshots): %w", n, snaps, ErrBusy)
		}
		return fmt.Errorf("%d open handles: %w", n, ErrBusy)
	}
	s.excl[name] = op
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.excl, name)
		s.mu.Unlock()
	}()
	info, err := s.be.getVolume(ctx, name)
	if err != nil {
		return err
	}
	return fn(info)
}

// shared runs fn on volume name as a non-exclusive operation: it fails
// with ErrBusy while an exclusive one runs.
func (s *volumeStore) shared(ctx context.Context, name string, fn func(info VolumeInfo) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.ops.Done()
	if op := s.exclusiveOp(name); op != "" {
		return fmt.Errorf("%s in progress: %w", op, ErrBusy)
	}
	info, err := s.be.getVolume(ctx, name)
	if err != nil {
		// Say which was missing: the callers name a snapshot too.
		return fmt.Errorf("volume %q: %w", name, err)
	}
	return fn(info)
}

func anyOpen(handles, snaps int) bool { return handles+snaps > 0 }

func (s *volumeStore) DeleteVolume(ctx context.Context, name string) error {
	err := s.exclusive(ctx, name, "delete", anyOpen, func(info VolumeInfo) error {
		return s.be.deleteVolume(ctx, info)
	})
	if err != nil {
		return fmt.Errorf("store: delete volume %q: %w", name, err)
	}
	return nil
}

func (s *volumeStore) ResizeVolume(ctx context.Context, name string, size int64) error {
	return s.resize(ctx, "resize", name, size, true)
}

func (s *volumeStore) GrowVolume(ctx context.Context, name string, size int64) error {
	return s.resize(ctx, "grow", name, size, false)
}

// resize is ResizeVolume (shrink) and GrowVolume (not shrink). Resizes and
// rollbacks hold s.resizing, so the size read to choose between a grow and
// a shrink is the one the change applies to.
func (s *volumeStore) resize(ctx context.Context, op, name string, size int64, shrink bool) error {
	err := checkSize(size)
	if err == nil {
		err = s.lockResize(ctx)
	}
	if err == nil {
		err = s.resizeLocked(ctx, name, size, shrink)
		s.unlockResize()
	}
	if err != nil {
		return fmt.Errorf("store: %s volume %q to %d bytes: %w", op, name, size, err)
	}
	return nil
}

func (s *volumeStore) resizeLocked(ctx context.Context, name string, size int64, shrink bool) error {
	// A grow runs beside open handles; a shrink needs the volume closed.
	var cur int64
	grown := false
	err := s.shared(ctx, name, func(info VolumeInfo) error {
		if cur = info.Size; size < cur {
			return nil
		}
		s.mu.Lock()
		open := len(s.open[name]) > 0
		s.mu.Unlock()
		grown = true
		return s.be.resizeVolume(ctx, info, size, open)
	})
	if err != nil || grown {
		return err
	}
	if !shrink {
		return fmt.Errorf("the volume has %d bytes: %w", cur, ErrShrink)
	}
	headOpen := func(handles, _ int) bool { return handles > 0 }
	return s.exclusive(ctx, name, "shrink", headOpen, func(info VolumeInfo) error {
		return s.be.resizeVolume(ctx, info, size, false)
	})
}

func (s *volumeStore) CreateSnapshot(ctx context.Context, vol, snap string) (SnapshotInfo, error) {
	var si SnapshotInfo
	err := checkName("snapshot", snap)
	if err == nil {
		err = s.shared(ctx, vol, func(info VolumeInfo) error {
			var err error
			si, err = s.be.createSnapshot(ctx, info, snap)
			return err
		})
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("store: snapshot %s@%s: %w", vol, snap, err)
	}
	return si, nil
}

func (s *volumeStore) DeleteSnapshot(ctx context.Context, vol, snap string) error {
	err := s.shared(ctx, vol, func(info VolumeInfo) error {
		// The snapshot is held exclusively (excl under "VOL@SNAP") from the
		// check for open handles to the end: an open of it meanwhile fails
		// with ErrBusy instead of getting a handle on what the deletion
		// takes apart.
		ref := vol + "@" + snap
		s.mu.Lock()
		n, op := s.snapOpen[ref], s.excl[ref]
		if n == 0 && op == "" {
			s.excl[ref] = "snapshot deletion"
		}
		s.mu.Unlock()
		switch {
		case n > 0:
			return fmt.Errorf("%d open handles: %w", n, ErrBusy)
		case op != "":
			return fmt.Errorf("%s in progress: %w", op, ErrBusy)
		}
		defer func() {
			s.mu.Lock()
			delete(s.excl, ref)
			s.mu.Unlock()
		}()
		return s.be.deleteSnapshot(ctx, info, snap)
	})
	if err != nil {
		return fmt.Errorf("store: delete snapshot %s@%s: %w", vol, snap, err)
	}
	return nil
}

func (s *volumeStore) Clone(ctx context.Context, vol, snap, newName string, opts CreateOptions) (VolumeInfo, error) {
	var out VolumeInfo
	err := checkName("volume", newName)
	if err == nil {
		err = checkMeta(opts.Meta)
	}
	if err == nil && opts.Raw != "" {
		err = fmt.Errorf("a clone cannot be raw: %w", ErrInvalid)
	}
	if err == nil {
		err = s.shared(ctx, vol, func(origin VolumeInfo) error {
			if op := s.exclusiveOp(newName); op != "" {
				return fmt.Errorf("%s of %q in progress: %w", op, newName, ErrBusy)
			}
			info, err := s.be.clone(ctx, origin, snap, newInfo(newName, 0, opts.Meta))
			out = info.clone()
			return err
		})
	}
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("store: clone %s@%s to %q: %w", vol, snap, newName, err)
	}
	return out, nil
}

func (s *volumeStore) Rollback(ctx context.Context, vol, snap string) error {
	// A rollback sets the snapshot's size.
	if err := s.lockResize(ctx); err != nil {
		return fmt.Errorf("store: rollback %s@%s: %w", vol, snap, err)
	}
	defer s.unlockResize()
	headOpen := func(handles, _ int) bool { return handles > 0 }
	found := false
	err := s.exclusive(ctx, vol, "rollback", headOpen, func(info VolumeInfo) error {
		found = true
		return s.be.rollback(ctx, info, snap)
	})
	if !found && errors.Is(err, ErrNotFound) {
		// Say which was missing, the volume or (from the backend) the
		// snapshot.
		err = fmt.Errorf("volume %q: %w", vol, err)
	}
	if err != nil {
		return fmt.Errorf("store: rollback %s to @%s: %w", vol, snap, err)
	}
	return nil
}

func (s *volumeStore) SetMeta(ctx context.Context, name string, meta map[string]string) error {
	err := checkMeta(meta)
	if err == nil {
		err = s.shared(ctx, name, func(info VolumeInfo) error {
			m := VolumeInfo{Meta: meta}.clone().Meta
			return s.be.setMeta(ctx, info, m)
		})
	}
	if err != nil {
		return fmt.Errorf("store: set meta of %q: %w", name, err)
	}
	return nil
}

func (s *volumeStore) Sync(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return fmt.Errorf("store: sync: %w", err)
	}
	defer s.ops.Done()
	if err := s.be.sync(ctx); err != nil {
		return fmt.Errorf("store: sync: %w", err)
	}
	return nil
}

func (s *volumeStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("store: %w", ErrClosed)
	}
	s.closed = true
	var handles []*volume
	for _, hs := range s.open {
		for v := range hs {
			handles = append(handles, v)
		}
	}
	s.mu.Unlock()

	s.ops.Wait()
	var errs []error
	for _, v := range handles {
		if err := v.shut(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.be.close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("store: close: %w", errors.Join(errs...))
	}
	return nil
}

// Health implements HealthChecker (nil for the backends that do not fail).
func (s *volumeStore) Health() error {
	if h, ok := s.be.(HealthChecker); ok {
		if err := h.Health(); err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	return nil
}

// Syncs implements Syncer for the backends that sync (0 for the others).
func (s *volumeStore) Syncs() uint64 {
	if sy, ok := s.be.(Syncer); ok {
		return sy.Syncs()
	}
	return 0
}
