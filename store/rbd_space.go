//go:build ceph

package store

import (
	"slices"
	"strings"

	"github.com/rnic-dev/rnic/internal/rbd"
)

// space fills info's Allocated, Exclusive and Snapshots from RBD's object
// map (whole-object diffs, the granularity of "rbd du"):
//   - Allocated: the objects the head holds (shared with snapshots or not);
//   - Exclusive: those changed since the newest snapshot and present;
//   - a snapshot's Exclusive: the objects it holds that changed since the
//     snapshot before it and changed again after it (in the next snapshot
//     or the head): what deleting it would free.
func (b *rbdBackend) space(head *rbd.Image, info *VolumeInfo) error {
	size := uint64(info.Size)
	snaps, err := head.Snapshots()
	if err != nil {
		return err
	}
	alloc, err := diffSet(head, "", size, true)
	if err != nil {
		return err
	}
	info.Allocated = alloc.bytes()
	info.Exclusive = info.Allocated
	if len(snaps) > 0 {
		excl, err := diffSet(head, snaps[len(snaps)-1].Name, size, true)
		if err != nil {
			return err
		}
		info.Exclusive = excl.bytes()
	}
	info.Snapshots = make([]SnapshotInfo, len(snaps))
	for i, s := range snaps {
		si := SnapshotInfo{Name: s.Name, Created: s.Created, Size: int64(s.Size)}
		kids, err := head.Children(s.Name)
		if err != nil {
			return err
		}
		for _, k := range kids {
			pool, image := k[:strings.LastIndexByte(k, '/')], k[strings.LastIndexByte(k, '/')+1:]
			si.Clones = append(si.Clones, b.volumeName(pool, image))
		}
		slices.Sort(si.Clones)
		if si.Exclusive, err = b.snapExclusive(head, snaps, i); err != nil {
			return err
		}
		info.Snapshots[i] = si
	}
	return nil
}

// snapExclusive is the bytes of snapshot i no neighbour shares.
func (b *rbdBackend) snapExclusive(head *rbd.Image, snaps []rbd.Snapshot, i int) (int64, error) {
	name := head.Name()
	at, err := b.pool.OpenSnapshot(name, snaps[i].Name)
	if err != nil {
		return 0, err
	}
	defer at.Close()
	prev := ""
	if i > 0 {
		prev = snaps[i-1].Name
	}
	mine, err := diffSet(at, prev, snaps[i].Size, true)
	if err != nil {
		return 0, err
	}
	next := head
	if i+1 < len(snaps) {
		if next, err = b.pool.OpenSnapshot(name, snaps[i+1].Name); err != nil {
			return 0, err
		}
		defer next.Close()
	}
	changed, err := diffSet(next, snaps[i].Name, snaps[i].Size, false)
	if err != nil {
		return 0, err
	}
	var n int64
	for o, l := range mine {
		if _, ok := changed[o]; ok {
			n += l
		}
	}
	return n, nil
}

// objSet maps object offsets to the bytes of the object in the set.
type objSet map[uint64]int64

func (s objSet) bytes() int64 {
	var n int64
	for _, l := range s {
		n += l
	}
	return n
}

// diffSet returns the objects in a diff of im from snapshot from: only
// those that exist if existing is set, every changed one otherwise.
func diffSet(im *rbd.Image, from string, size uint64, existing bool) (objSet, error) {
	s := objSet{}
	if size == 0 {
		return s, nil
	}
	err := im.Diff(from, 0, size, true, func(e rbd.Extent) error {
		if existing && !e.Exists {
			return nil
		}
		s[e.Offset] += int64(e.Length)
		return nil
	})
	return s, err
}
