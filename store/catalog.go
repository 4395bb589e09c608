package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest volume name accepted, in bytes.
const MaxNameLen = 255

// MaxMetaLen is the most bytes of keys and values a volume's Meta may hold.
const MaxMetaLen = 64 << 10

// volumeStore implements Store on top of a backend.
type volumeStore struct {
	be backend

	mu       sync.Mutex
	closed   bool
	open     map[string]map[*volume]struct{} // open handles by volume name
	deleting map[string]bool                 // names whose DeleteVolume is running
	ops      sync.WaitGroup                  // store-level calls in flight
}

// Syncs implements Syncer: the syncs of a badger store; a memory store has
// nothing to sync and reports 0.
func (s *volumeStore) Syncs() uint64 {
	if b, ok := s.be.(*badgerBackend); ok {
		return uint64(b.syncs.Load())
	}
	return 0
}

func newVolumeStore(be backend) *volumeStore {
	return &volumeStore{
		be:       be,
		open:     make(map[string]map[*volume]struct{}),
		deleting: make(map[string]bool),
	}
}

// enter registers a store-level call; it fails once Close has begun.
func (s *volumeStore) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("store: %w", ErrClosed)
	}
	s.ops.Add(1)
	return nil
}

func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("store: empty volume name: %w", ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("store: volume name longer than %d bytes: %w", MaxNameLen, ErrInvalid)
	case !utf8.ValidString(name):
		return fmt.Errorf("store: volume name %q is not UTF-8: %w", name, ErrInvalid)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("store: volume name %q contains control characters: %w", name, ErrInvalid)
	}
	return nil
}

// checkMeta accepts UTF-8 keys and values (so they survive the JSON of a
// stored record unchanged), MaxMetaLen bytes in all.
func checkMeta(meta map[string]string) error {
	n := 0
	for k, v := range meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("store: volume meta %q is not UTF-8: %w", k, ErrInvalid)
		}
		n += len(k) + len(v)
	}
	if n > MaxMetaLen {
		return fmt.Errorf("store: volume meta of %d bytes, limit %d: %w", n, MaxMetaLen, ErrInvalid)
	}
	return nil
}

func (s *volumeStore) CreateVolume(ctx context.Context, name string, size int64, meta map[string]string) (VolumeInfo, error) {
	if err := checkName(name); err != nil {
		return VolumeInfo{}, err
	}
	if err := checkMeta(meta); err != nil {
		return VolumeInfo{}, err
	}
	if size <= 0 || size%BlockSize != 0 {
		return VolumeInfo{}, fmt.Errorf("store: create volume %q: size %d is not a positive multiple of %d: %w",
			name, size, BlockSize, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return VolumeInfo{}, fmt.Errorf("store: create volume %q: %w", name, err)
	}
	if err := s.enter(); err != nil {
		return VolumeInfo{}, err
	}
	defer s.ops.Done()
	s.mu.Lock()
	busy := s.deleting[name]
	s.mu.Unlock()
	if busy {
		return VolumeInfo{}, fmt.Errorf("store: create volume %q: being deleted: %w", name, ErrBusy)
	}
	info := VolumeInfo{Name: name, Size: size, Created: time.Now().UTC(), Meta: meta}
	info = info.clone()
	info, err := s.be.createVolume(ctx, info)
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("store: create volume %q: %w", name, err)
	}
	return info.clone(), nil
}

func (s *volumeStore) OpenVolume(ctx context.Context, name string) (Volume, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: open volume %q: %w", name, err)
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	// Register the handle before looking the volume up, so a DeleteVolume
	// starting meanwhile sees it and fails with ErrBusy.
	v := &volume{store: s}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("store: open volume %q: %w", name, ErrClosed)
	}
	if s.deleting[name] {
		s.mu.Unlock()
		return nil, fmt.Errorf("store: open volume %q: being deleted: %w", name, ErrBusy)
	}
	hs := s.open[name]
	if hs == nil {
		hs = make(map[*volume]struct{})
		s.open[name] = hs
	}
	hs[v] = struct{}{}
	s.mu.Unlock()

	info, err := s.be.getVolume(ctx, name)
	if err != nil {
		s.release(name, v)
		return nil, fmt.Errorf("store: open volume %q: %w", name, err)
	}
	v.info, v.blocks, v.dev = info, info.Blocks(), s.be.device(info)
	return v, nil
}

// release forgets a closed handle.
func (s *volumeStore) release(name string, v *volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := s.open[name]
	delete(hs, v)
	if len(hs) == 0 {
		delete(s.open, name)
	}
}

func (s *volumeStore) ListVolumes(ctx context.Context) ([]VolumeInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: list volumes: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, err
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

func (s *volumeStore) DeleteVolume(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: delete volume %q: %w", name, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.ops.Done()
	s.mu.Lock()
	switch {
	case len(s.open[name]) > 0:
		n := len(s.open[name])
		s.mu.Unlock()
		return fmt.Errorf("store: delete volume %q: %d open handles: %w", name, n, ErrBusy)
	case s.deleting[name]:
		s.mu.Unlock()
		return fmt.Errorf("store: delete volume %q: already being deleted: %w", name, ErrBusy)
	}
	s.deleting[name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deleting, name)
		s.mu.Unlock()
	}()

	info, err := s.be.getVolume(ctx, name)
	if err != nil {
		return fmt.Errorf("store: delete volume %q: %w", name, err)
	}
	if err := s.be.deleteVolume(ctx, info); err != nil {
		return fmt.Errorf("store: delete volume %q (id %d): %w", name, info.ID, err)
	}
	return nil
}

func (s *volumeStore) Sync(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
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
	for _, v := range handles {
		v.shut()
	}
	if err := s.be.close(); err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}
