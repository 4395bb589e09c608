package store

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
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
	Epoch     uint32     `json:"epoch"`
	Snapshots []thinSnap `json:"snapshots,omitempty"` // by epoch
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

const thinRecordVersion = 1

func encodeThinRecord(r *thinRecord) ([]byte, error) {
	r.Version = thinRecordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode volume record: %w", err)
	}
	return b, nil
}

func decodeThinRecord(name string, b []byte) (*thinRecord, error) {
	var r thinRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("volume record %q: %w: %w", name, err, ErrCorrupt)
	}
	if err := r.check(name); err != nil {
		return nil, err
	}
	return &r, nil
}

// check reports a record that cannot be the volume name's.
func (r *thinRecord) check(name string) error {
	switch {
	case r.Version != thinRecordVersion:
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

// recordCache keeps the decoded form of the volume records too large to
// decode cheaply, with the stored bytes they were decoded from. A record
// lists its volume's snapshots, so it grows by about 100 bytes with each:
// with 5,000 of them, decoding it took two thirds of a snapshot's
// creation (two decodes of 500 KB of JSON, 9 ms of the 17 ms it took on
// one host). A lookup compares the stored bytes with the cached ones, so
// a hit returns exactly what decoding would; whatever changed the record,
// committed or not, a changed value is a miss.
type recordCache struct {
	mu  sync.Mutex
	m   map[string]cachedRecord
	min int // the smallest record cached; 0: recordCacheMin (tests lower it)
}

type cachedRecord struct {
	raw []byte
	rec *thinRecord
}

// recordCacheMin is the size from which a record is cached; decoding a
// smaller one costs a few microseconds.
const recordCacheMin = 4 << 10

// get returns a copy of the record stored as raw under name, or nil.
func (c *recordCache) get(name string, raw []byte) *thinRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.holds(raw) {
		return nil
	}
	e, ok := c.m[name]
	if !ok || !bytes.Equal(e.raw, raw) {
		return nil
	}
	return e.rec.clone()
}

// put records that raw decodes to rec (which the caller keeps: the cache
// holds copies of both).
func (c *recordCache) put(name string, raw []byte, rec *thinRecord) {
	c.mu.Lock()
	small := !c.holds(raw)
	c.mu.Unlock()
	if small {
		c.drop(name)
		return
	}
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
	if c.m == nil {
		c.m = make(map[string]cachedRecord)
	}
	c.m[name] = e
}

// holds reports whether a record stored as raw is cached (c.mu held).
func (c *recordCache) holds(raw []byte) bool {
	return len(raw) >= cmp.Or(c.min, recordCacheMin)
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
