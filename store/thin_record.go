package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// thinRecord is the stored form of a thin store's volume (JSON, under
// thinVolumeKey).
type thinRecord struct {
	Version int               `json:"v"`
	Name    string            `json:"name"`
	ID      uint32            `json:"id"`
	Kind    string            `json:"kind"`
	Size    int64             `json:"size"`
	Created time.Time         `json:"created"`
	Meta    map[string]string `json:"meta,omitempty"`
	RawPath string            `json:"raw,omitempty"`
	// Origin is the snapshot a clone was made from.
	Origin *thinOrigin `json:"origin,omitempty"`
	// Epoch is the volume's current epoch: entries made now are born in
	// it. A snapshot takes the current epoch and the volume moves to the
	// next.
	Epoch uint32 `json:"epoch"`
	// Snapshots, by epoch. Each is stored under a key of its own (snapKey),
	// so that taking or deleting one writes that key and the record, not
	// all the others; records of version 1 (format 1) held them here.
	Snapshots []thinSnap `json:"snapshots,omitempty"`
	// SnapTag changes, to a random value, with every change putRecord
	// makes to the snapshot keys: a record's stored bytes then tell its
	// snapshots too, which the record cache relies on.
	SnapTag uint64 `json:"snaptag,omitempty"`
	// Rollback is a rollback under way (finished at open after a crash).
	Rollback *thinRollback `json:"rollback,omitempty"`
}

type thinOrigin struct {
	ID    uint32 `json:"id"`
	Epoch uint32 `json:"epoch"`
	Size  int64  `json:"size"` // the snapshot's size
}

type thinSnap struct {
	Name    string    `json:"name"`
	Epoch   uint32    `json:"epoch"`
	Created time.Time `json:"created"`
	Size    int64     `json:"size"`
	// Deleting: the snapshot is being deleted; it is invisible, its delta
	// is still read through while it is moved or released.
	Deleting bool `json:"deleting,omitempty"`
}

type thinRollback struct {
	Epoch uint32 `json:"epoch"` // the snapshot rolled back to
	Next  uint64 `json:"next"`  // the first cluster not done yet
}

// thinRecordVersion is the version of the records written; version 1
// (format 1) held the snapshots in the record, and is read to migrate it.
const (
	thinRecordVersion   = 2
	thinRecordVersionV1 = 1
)

// encodeThinRecord encodes the record without its snapshots (see
// putRecord).
func encodeThinRecord(r *thinRecord) ([]byte, error) {
	r.Version = thinRecordVersion
	head := *r
	head.Snapshots = nil
	b, err := json.Marshal(&head)
	if err != nil {
		return nil, fmt.Errorf("encode volume record: %w", err)
	}
	return b, nil
}

// decodeThinRecord decodes a record as stored: of version 2 without its
// snapshots (see loadSnaps), of version 1 with them.
func decodeThinRecord(name string, b []byte) (*thinRecord, error) {
	var r thinRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("volume record %q: %w: %w", name, err, ErrCorrupt)
	}
	if err := r.check(name); err != nil {
		return nil, err
	}
	if r.Version == thinRecordVersion && r.Snapshots != nil {
		return nil, fmt.Errorf("volume record %q: snapshots inside a version %d record: %w", name, r.Version, ErrCorrupt)
	}
	return &r, nil
}

// encodeSnap and decodeSnap: a snapshot as stored under snapKey (JSON).
func encodeSnap(s *thinSnap) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %q: %w", s.Name, err)
	}
	return b, nil
}

func decodeSnap(vol string, epoch uint32, b []byte) (thinSnap, error) {
	var s thinSnap
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("volume %q snapshot of epoch %d: %w: %w", vol, epoch, err, ErrCorrupt)
	}
	if s.Epoch != epoch || s.Name == "" {
		return s, fmt.Errorf("volume %q: snapshot %q of epoch %d stored as epoch %d: %w", vol, s.Name, s.Epoch, epoch, ErrCorrupt)
	}
	return s, nil
}

// newSnapTag draws a record's SnapTag (never 0, which a record without
// snapshot keys has).
func newSnapTag() uint64 { return rand.Uint64() | 1 }

// sameSnap reports whether two snapshots are stored the same.
func sameSnap(a, b *thinSnap) bool {
	return a.Name == b.Name && a.Epoch == b.Epoch && a.Created.Equal(b.Created) && a.Size == b.Size && a.Deleting == b.Deleting
}

// check reports a record that cannot be the volume name's.
func (r *thinRecord) check(name string) error {
	switch {
	case r.Version != thinRecordVersion && r.Version != thinRecordVersionV1:
		return fmt.Errorf("volume record %q: version %d, want %d: %w", name, r.Version, thinRecordVersion, ErrCorrupt)
	case r.Name != name:
		return fmt.Errorf("volume record %q names %q: %w", name, r.Name, ErrCorrupt)
	case r.ID == 0 || r.Epoch == 0:
		return fmt.Errorf("volume record %q: id %d epoch %d: %w", name, r.ID, r.Epoch, ErrCorrupt)
	case r.Size <= 0 || r.Size%BlockSize != 0:
		return fmt.Errorf("volume record %q: size %d: %w", name, r.Size, ErrCorrupt)
	case r.Kind != KindThin && r.Kind != KindRaw:
		return fmt.Errorf("volume record %q: kind %q: %w", name, r.Kind, ErrCorrupt)
	}
	return nil
}

// latest returns the epoch of the newest live snapshot, 0 if none: head
// entries born in it or before are shared with it.
func (r *thinRecord) latest() uint32 {
	for i := len(r.Snapshots) - 1; i >= 0; i-- {
		if !r.Snapshots[i].Deleting {
			return r.Snapshots[i].Epoch
		}
	}
	return 0
}

// snap returns the live snapshot of that name.
func (r *thinRecord) snap(name string) (*thinSnap, error) {
	for i := range r.Snapshots {
		if s := &r.Snapshots[i]; s.Name == name && !s.Deleting {
			return s, nil
		}
	}
	return nil, fmt.Errorf("snapshot %q: %w", name, ErrNotFound)
}

// snapByEpoch returns the snapshot of that epoch, live or being deleted.
func (r *thinRecord) snapByEpoch(e uint32) *thinSnap {
	for i := range r.Snapshots {
		if r.Snapshots[i].Epoch == e {
			return &r.Snapshots[i]
		}
	}
	return nil
}

// clone returns a copy of r that shares no memory with it.
func (r *thinRecord) clone() *thinRecord {
	c := *r
	c.Meta = maps.Clone(r.Meta)
	c.Snapshots = slices.Clone(r.Snapshots)
	if r.Origin != nil {
		o := *r.Origin
		c.Origin = &o
	}
	if r.Rollback != nil {
		rb := *r.Rollback
		c.Rollback = &rb
	}
	return &c
}

// recordCache keeps the decoded volume records, each with the stored
// bytes of its record (without the snapshots, see putRecord). A lookup
// compares the stored bytes with the cached ones, so a hit returns exactly
// what decoding and loading the snapshots would: the bytes hold SnapTag,
// which every change to the snapshot keys draws anew, so the same bytes
// mean the same snapshots too, whatever wrote them and whether or not its
// transaction committed. With 5,000 snapshots, decoding the record of
// format 1 took two thirds of a snapshot's creation; loading 5,000
// snapshot keys takes longer still.
type recordCache struct {
	mu  sync.Mutex
	m   map[string]cachedRecord
	off bool // tests: every lookup decodes
}

type cachedRecord struct {
	raw []byte
	rec *thinRecord
}

// get returns the record stored as raw under name, or nil: a copy, or
// without own the cached record itself, which the caller must not change.
func (c *recordCache) get(name string, raw []byte, own bool) *thinRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[name]
	if !ok || !bytes.Equal(e.raw, raw) {
		return nil
	}
	if !own {
		return e.rec
	}
	return e.rec.clone()
}

// put records that raw and the snapshot keys of rec.SnapTag make rec
// (which the caller keeps: the cache holds copies of both).
func (c *recordCache) put(name string, raw []byte, rec *thinRecord) {
	e := cachedRecord{raw: bytes.Clone(raw), rec: rec.clone()}
	// As decoding makes them: empty is nil (both are omitted when empty).
	if len(e.rec.Meta) == 0 {
		e.rec.Meta = nil
	}
	if len(e.rec.Snapshots) == 0 {
		e.rec.Snapshots = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off {
		return
	}
	if c.m == nil {
		c.m = make(map[string]cachedRecord)
	}
	c.m[name] = e
}

func (c *recordCache) drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, name)
}

// info returns the identity fields of the record.
func (r *thinRecord) info() VolumeInfo {
	return VolumeInfo{Name: r.Name, ID: r.ID, Size: r.Size, Created: r.Created, Meta: r.Meta, Kind: r.Kind, RawPath: r.RawPath}
}
