package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// The v2 contract: block status, metadata, resize, snapshots, clones,
// rollback and space accounting.

const mib = 1 << 20

// extents returns the extents BlockStatus reports over the whole volume,
// checking that they cover it exactly, in order.
func extents(t *testing.T, v store.Volume) []store.Extent {
	t.Helper()
	n := v.Info().Blocks()
	var out []store.Extent
	next := uint64(0)
	err := v.BlockStatus(context.Background(), 0, n, func(e store.Extent) bool {
		if e.LBA != next || e.Count == 0 {
			t.Fatalf("BlockStatus: extent %+v after block %d", e, next)
		}
		next += e.Count
		out = append(out, e)
		return true
	})
	if err != nil {
		t.Fatalf("BlockStatus: %v", err)
	}
	if next != n {
		t.Fatalf("BlockStatus covered %d of %d blocks", next, n)
	}
	return out
}

// holeAt reports whether block lba lies in a hole extent.
func holeAt(es []store.Extent, lba uint64) bool {
	for _, e := range es {
		if lba >= e.LBA && lba-e.LBA < e.Count {
			return e.Hole
		}
	}
	return false
}

// checkHolesReadZeros reads every hole extent and fails if it is not zeros.
func checkHolesReadZeros(t *testing.T, v store.Volume, es []store.Extent) {
	t.Helper()
	for _, e := range es {
		if !e.Hole {
			continue
		}
		for lba := e.LBA; lba < e.LBA+e.Count; lba += 256 {
			n := min(256, e.LBA+e.Count-lba)
			if !IsZero(mustRead(t, v, lba, int(n))) {
				t.Fatalf("hole extent %+v does not read as zeros near block %d", e, lba)
			}
		}
	}
}

func testBlockStatus(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("bs", 64*mib)
	defer v.Close()
	es := extents(t, v)
	if !holeAt(es, 0) || !holeAt(es, 64*mib/bs-1) {
		t.Fatalf("a new volume is not all holes: %+v", es)
	}
	const at, n = 8 * mib / bs, 4 * mib / bs
	mustWrite(t, v, at, Pattern(at, n, 1))
	es = extents(t, v)
	for lba := uint64(at); lba < at+n; lba += 97 {
		if holeAt(es, lba) {
			t.Fatalf("written block %d reported as a hole: %+v", lba, es)
		}
	}
	if !holeAt(es, 40*mib/bs) {
		t.Fatalf("block at 40 MiB, never written, not a hole: %+v", es)
	}
	checkHolesReadZeros(t, v, es)

	// A range in the middle, and stopping early.
	var got []store.Extent
	if err := v.BlockStatus(ctx, at+1, 3, func(e store.Extent) bool { got = append(got, e); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (store.Extent{LBA: at + 1, Count: 3}) {
		t.Fatalf("BlockStatus(%d, 3) = %+v", at+1, got)
	}
	calls := 0
	if err := v.BlockStatus(ctx, 0, 64*mib/bs, func(store.Extent) bool { calls++; return false }); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("BlockStatus went on after fn returned false: %d calls", calls)
	}
	wantErr(t, "BlockStatus past the end", v.BlockStatus(ctx, 64*mib/bs-1, 2, func(store.Extent) bool { return true }),
		store.ErrOutOfRange)

	if err := v.Trim(ctx, at, n); err != nil {
		t.Fatal(err)
	}
	es = extents(t, v)
	if !holeAt(es, at+n/2) {
		t.Fatalf("trimmed 4 MiB still allocated in the middle: %+v", es)
	}
	checkHolesReadZeros(t, v, es)
}

// testWriteZeroesAllocated: WriteZeroesAllocated makes blocks read as
// zeros and keeps them allocated: BlockStatus reports them as data (over
// data, over blocks never written, across the two, in part of an
// allocation unit, at the volume's end), and the space figures count
// them. Blocks a snapshot or a clone's origin shares get blocks of the
// volume's own: the snapshot keeps its data, the head's zeros are
// exclusive to it.
func testWriteZeroesAllocated(t *testing.T, s *suite) {
	ctx := context.Background()
	const n = 2 * mib / bs
	v := s.mustCreate("za", 2*mib)
	defer v.Close()
	model := make([]byte, n*bs)
	copy(model, Pattern(0, 256, 31))
	mustWrite(t, v, 0, model[:256*bs])
	ranges := []struct {
		what       string
		lba, count uint64
		fua        bool
	}{
		{"whole clusters of data", 16, 32, false},
		{"part of a cluster, FUA", 101, 3, true},
		{"never written", 300, 40, false},
		{"data, then never written", 250, 20, false},
		{"the last block", n - 1, 1, false},
	}
	for _, r := range ranges {
		mustZeroAllocated(t, v, r.lba, r.count, r.fua, r.what)
		clear(model[r.lba*bs : (r.lba+r.count)*bs])
	}
	equalBlocks(t, "after WriteZeroesAllocated", 0, mustRead(t, v, 0, n), model)
	checkHolesReadZeros(t, v, extents(t, v))
	// The 256 blocks written, and the zeroed blocks past them.
	if st := s.stat("za"); st.Allocated < (256+40+14+1)*bs {
		t.Fatalf("allocated %d bytes after zeroing allocated, want at least %d", st.Allocated, (256+40+14+1)*bs)
	}
	if err := v.WriteZeroesAllocated(ctx, 7, 0, true); err != nil {
		t.Fatalf("WriteZeroesAllocated of no blocks: %v", err)
	}
	wantErr(t, "WriteZeroesAllocated past the end", v.WriteZeroesAllocated(ctx, n-1, 2, false), store.ErrOutOfRange)
	equalBlocks(t, "after refused WriteZeroesAllocated", 0, mustRead(t, v, 0, n), model)

	if snapshotsUnsupported(t, s) {
		return
	}
	snapData := Pattern(384, 64, 32)
	mustWrite(t, v, 384, snapData)
	mustSnap(t, s, "za", "s")
	mustZeroAllocated(t, v, 384, 64, false, "blocks a snapshot shares")
	if st := s.stat("za"); st.Exclusive < 64*bs {
		t.Fatalf("head exclusive %d bytes after zeroing 64 shared blocks allocated, want at least %d", st.Exclusive, 64*bs)
	}
	sv := s.mustOpen("za@s")
	equalBlocks(t, "the snapshot after the head's WriteZeroesAllocated", 384, mustRead(t, sv, 384, 64), snapData)
	wantErr(t, "WriteZeroesAllocated on a snapshot", sv.WriteZeroesAllocated(ctx, 0, 1, false), store.ErrReadOnly)
	sv.Close()

	// A clone reads blocks 0-15 from its origin: zeroed allocated, they
	// become its own.
	mustClone(t, s, "za", "s", "zc")
	cv := s.mustOpen("zc")
	defer cv.Close()
	mustZeroAllocated(t, cv, 0, 16, true, "a clone's origin data")
	if st := s.stat("zc"); st.Allocated < 16*bs {
		t.Fatalf("clone allocated %d bytes after zeroing 16 blocks allocated, want at least %d", st.Allocated, 16*bs)
	}
	equalBlocks(t, "the origin after its clone's WriteZeroesAllocated", 0, mustRead(t, v, 0, 16), model[:16*bs])
}

// mustZeroAllocated runs WriteZeroesAllocated over count blocks at lba
// (what says where they are) and checks that they read as zeros and that
// BlockStatus reports none of them as a hole.
func mustZeroAllocated(t *testing.T, v store.Volume, lba, count uint64, fua bool, what string) {
	t.Helper()
	if err := v.WriteZeroesAllocated(context.Background(), lba, count, fua); err != nil {
		t.Fatalf("WriteZeroesAllocated(%d, %d) over %s: %v", lba, count, what, err)
	}
	if !IsZero(mustRead(t, v, lba, int(count))) {
		t.Fatalf("%s: blocks %d+%d do not read as zeros after WriteZeroesAllocated", what, lba, count)
	}
	es := extents(t, v)
	for b := lba; b < lba+count; b++ {
		if holeAt(es, b) {
			t.Fatalf("%s: block %d, zeroed allocated, reported as a hole: %+v", what, b, es)
		}
	}
}

func testSetMetaAndStat(t *testing.T, s *suite) {
	ctx := context.Background()
	if _, err := s.create("m", mib); err != nil {
		t.Fatal(err)
	}
	info := s.stat("m")
	if info.Name != "m" || info.Size != mib || info.Kind == "" || info.ID == 0 {
		t.Fatalf("StatVolume = %+v", info)
	}
	meta := map[string]string{"a": "1", "b": "2"}
	if err := s.st.SetMeta(ctx, "m", meta); err != nil {
		t.Fatal(err)
	}
	meta["a"] = "changed"
	if got := s.stat("m").Meta; len(got) != 2 || got["a"] != "1" || got["b"] != "2" {
		t.Fatalf("meta after SetMeta: %v", got)
	}
	v := s.mustOpen("m")
	if got := v.Info().Meta; got["b"] != "2" {
		t.Fatalf("Info().Meta = %v", got)
	}
	v.Close()
	if err := s.st.SetMeta(ctx, "m", nil); err != nil {
		t.Fatal(err)
	}
	if got := s.stat("m").Meta; len(got) != 0 {
		t.Fatalf("meta after SetMeta(nil): %v", got)
	}
	wantErr(t, "SetMeta of a missing volume", s.st.SetMeta(ctx, "nope", meta), store.ErrNotFound)
	wantErr(t, "SetMeta with bad UTF-8", s.st.SetMeta(ctx, "m", map[string]string{"k": "\xff"}), store.ErrInvalid)
	_, err := s.st.StatVolume(ctx, "nope")
	wantErr(t, "StatVolume of a missing volume", err, store.ErrNotFound)
}

func testResize(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("r", mib)
	defer v.Close()
	// To the volume's own size, a resize changes nothing and succeeds, as
	// GrowVolume's contract says, also where resizes are not supported.
	if err := s.st.ResizeVolume(ctx, "r", mib); err != nil {
		t.Fatalf("ResizeVolume to the same size: %v", err)
	}
	if err := s.st.GrowVolume(ctx, "r", mib); err != nil {
		t.Fatalf("GrowVolume to the same size: %v", err)
	}
	if got := v.Info().Size; got != mib {
		t.Fatalf("size after a resize to the same size: %d", got)
	}
	if s.o.NoResize {
		wantErr(t, "ResizeVolume", s.st.ResizeVolume(ctx, "r", 2*mib), store.ErrNotSupported)
		wantErr(t, "GrowVolume", s.st.GrowVolume(ctx, "r", 2*mib), store.ErrNotSupported)
		wantErr(t, "GrowVolume below the size", s.st.GrowVolume(ctx, "r", mib/2), store.ErrShrink)
		v.Close()
		wantErr(t, "shrink", s.st.ResizeVolume(ctx, "r", mib/2), store.ErrNotSupported)
		if err := s.st.ResizeVolume(ctx, "r", mib); err != nil {
			t.Fatalf("ResizeVolume to the same size, closed: %v", err)
		}
		if got := s.stat("r").Size; got != mib {
			t.Fatalf("size after the refused resizes: %d", got)
		}
		return
	}
	data := Pattern(0, mib/bs, 3)
	mustWrite(t, v, 0, data)
	// Grow while open: the handle sees it at once.
	if err := s.st.ResizeVolume(ctx, "r", 2*mib); err != nil {
		t.Fatalf("grow while open: %v", err)
	}
	if got := v.Info().Size; got != 2*mib {
		t.Fatalf("open handle's size after grow: %d", got)
	}
	if !IsZero(mustRead(t, v, mib/bs, mib/bs)) {
		t.Fatal("the grown part does not read as zeros")
	}
	// GrowVolume never shrinks, also when grows race: the largest wins.
	wantErr(t, "GrowVolume below the size", s.st.GrowVolume(ctx, "r", mib), store.ErrShrink)
	if err := s.st.GrowVolume(ctx, "r", 2*mib); err != nil {
		t.Fatalf("GrowVolume to the same size: %v", err)
	}
	var wg sync.WaitGroup
	for i := range int64(8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.st.GrowVolume(ctx, "r", 2*mib+(i+1)*bs); err != nil && !errors.Is(err, store.ErrShrink) {
				t.Errorf("racing GrowVolume: %v", err)
			}
		}()
	}
	wg.Wait()
	if got := v.Info().Size; got != 2*mib+8*bs {
		t.Fatalf("size after racing grows: %d, want the largest, %d", got, 2*mib+8*bs)
	}
	mustWrite(t, v, 2*mib/bs-1, Pattern(2*mib/bs-1, 1, 4))
	wantErr(t, "shrink while open", s.st.ResizeVolume(ctx, "r", mib/2), store.ErrBusy)
	for _, bad := range []int64{0, -bs, bs + 1} {
		wantErr(t, "resize to a bad size", s.st.ResizeVolume(ctx, "r", bad), store.ErrInvalid)
	}
	wantErr(t, "resize of a missing volume", s.st.ResizeVolume(ctx, "nope", mib), store.ErrNotFound)
	v.Close()

	if err := s.st.ResizeVolume(ctx, "r", mib/2); err != nil {
		t.Fatalf("shrink: %v", err)
	}
	if got := s.stat("r").Size; got != mib/2 {
		t.Fatalf("size after shrink: %d", got)
	}
	if err := s.st.ResizeVolume(ctx, "r", 2*mib); err != nil {
		t.Fatalf("grow again: %v", err)
	}
	v = s.mustOpen("r")
	equalBlocks(t, "data kept by the shrink", 0, mustRead(t, v, 0, mib/2/bs), data[:mib/2])
	if !IsZero(mustRead(t, v, mib/2/bs, 3*mib/2/bs)) {
		t.Fatal("blocks cut by a shrink came back after a grow")
	}
}

// snapshotsUnsupported checks that a backend without snapshots says so.
func snapshotsUnsupported(t *testing.T, s *suite) bool {
	if !s.o.NoSnapshots {
		return false
	}
	ctx := context.Background()
	if _, err := s.create("nosnap", mib); err != nil {
		t.Fatal(err)
	}
	_, err := s.st.CreateSnapshot(ctx, "nosnap", "s")
	wantErr(t, "CreateSnapshot", err, store.ErrNotSupported)
	return true
}

func mustSnap(t *testing.T, s *suite, vol, snap string) store.SnapshotInfo {
	t.Helper()
	si, err := s.st.CreateSnapshot(context.Background(), vol, snap)
	if err != nil {
		t.Fatalf("CreateSnapshot(%s@%s): %v", vol, snap, err)
	}
	return si
}

func mustClone(t *testing.T, s *suite, vol, snap, name string) {
	t.Helper()
	if _, err := s.st.Clone(context.Background(), vol, snap, name, store.CreateOptions{}); err != nil {
		t.Fatalf("Clone(%s@%s, %s): %v", vol, snap, name, err)
	}
}

// readAll reads a whole volume or snapshot by name.
func (s *suite) readAll(name string) []byte {
	s.t.Helper()
	v := s.mustOpen(name)
	defer v.Close()
	return mustRead(s.t, v, 0, int(v.Info().Blocks()))
}

func testSnapshots(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		return
	}
	ctx := context.Background()
	const n = 256
	v := s.mustCreate("v", n*bs)
	defer v.Close()
	a := Pattern(0, n, 1)
	mustWrite(t, v, 0, a)
	si := mustSnap(t, s, "v", "s1")
	if si.Name != "s1" || si.Size != n*bs || si.Created.IsZero() {
		t.Fatalf("SnapshotInfo = %+v", si)
	}
	b := Pattern(10, 20, 2)
	mustWrite(t, v, 10, b)
	if err := v.Trim(ctx, 100, 50); err != nil {
		t.Fatal(err)
	}
	head := slices.Clone(a)
	copy(head[10*bs:], b)
	clear(head[100*bs : 150*bs])
	equalBlocks(t, "head", 0, mustRead(t, v, 0, n), head)
	equalBlocks(t, "snapshot", 0, s.readAll("v@s1"), a)

	sv := s.mustOpen("v@s1")
	info := sv.Info()
	if !info.ReadOnly || info.Name != "v@s1" || info.Size != n*bs {
		t.Fatalf("snapshot handle Info = %+v", info)
	}
	wantErr(t, "write to a snapshot", sv.WriteBlocks(ctx, 0, make([]byte, bs), false), store.ErrReadOnly)
	wantErr(t, "trim of a snapshot", sv.Trim(ctx, 0, 1), store.ErrReadOnly)
	wantErr(t, "delete an open snapshot", s.st.DeleteSnapshot(ctx, "v", "s1"), store.ErrBusy)
	wantErr(t, "delete a volume with an open snapshot", s.st.DeleteVolume(ctx, "v"), store.ErrBusy)
	if err := sv.Flush(ctx); err != nil {
		t.Fatalf("Flush of a snapshot handle: %v", err)
	}
	sv.Close()

	_, err := s.st.CreateSnapshot(ctx, "v", "s1")
	wantErr(t, "snapshot name taken", err, store.ErrExists)
	_, err = s.st.CreateSnapshot(ctx, "nope", "s1")
	wantErr(t, "snapshot of a missing volume", err, store.ErrNotFound)
	_, err = s.st.OpenVolume(ctx, "v@nope")
	wantErr(t, "open a missing snapshot", err, store.ErrNotFound)
	// "v@" is not v: an empty snapshot name (an unset variable in
	// "v@$SNAP") must not open the writable volume.
	for _, ref := range []string{"v@", "@s1", "v@s1@x"} {
		_, err = s.st.OpenVolume(ctx, ref)
		wantErr(t, "open "+ref, err, store.ErrInvalid)
	}
	wantErr(t, "delete a missing snapshot", s.st.DeleteSnapshot(ctx, "v", "nope"), store.ErrNotFound)

	mustSnap(t, s, "v", "s2")
	st := s.stat("v")
	if len(st.Snapshots) != 2 || st.Snapshots[0].Name != "s1" || st.Snapshots[1].Name != "s2" {
		t.Fatalf("Snapshots = %+v", st.Snapshots)
	}
	equalBlocks(t, "second snapshot", 0, s.readAll("v@s2"), head)
	if err := s.st.DeleteSnapshot(ctx, "v", "s1"); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "s2 after deleting s1", 0, s.readAll("v@s2"), head)
	equalBlocks(t, "head after deleting s1", 0, mustRead(t, v, 0, n), head)
	v.Close()
	// Deleting a volume takes its snapshots along.
	if err := s.st.DeleteVolume(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	_, err = s.st.OpenVolume(ctx, "v@s2")
	wantErr(t, "open a snapshot of a deleted volume", err, store.ErrNotFound)
	if _, err := s.create("v", n*bs); err != nil {
		t.Fatal(err)
	}
	if st := s.stat("v"); len(st.Snapshots) != 0 {
		t.Fatalf("a recreated volume has snapshots %+v", st.Snapshots)
	}
	if !IsZero(s.readAll("v")) {
		t.Fatal("a recreated volume shows old data")
	}
}

func testSnapshotNames(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		return
	}
	ctx := context.Background()
	if _, err := s.create("v", mib); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a@b", "a/b", "new\nline", "\xff"} {
		_, err := s.st.CreateSnapshot(ctx, "v", bad)
		wantErr(t, fmt.Sprintf("snapshot name %q", bad), err, store.ErrInvalid)
	}
	_, err := s.create("a@b", mib)
	wantErr(t, "volume name with '@'", err, store.ErrInvalid)
}

// testSnapshotOfOpenVolume takes snapshots while writers run: each
// snapshot holds, per block, a whole write no older than the last one
// acknowledged before CreateSnapshot and no newer than the last one started
// before it returned.
func testSnapshotOfOpenVolume(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		return
	}
	ctx := context.Background()
	const n, writers = 64, 4
	v := s.mustCreate("live", n*bs)
	defer v.Close()
	tw := StartTagWriters(ctx, v, n, writers)
	for i := range 5 {
		lo := Load(tw.Acked)
		name := fmt.Sprintf("s%d", i)
		mustSnap(t, s, "live", name)
		hi := Load(tw.Started)
		if err := CheckTags(s.readAll("live@"+name), lo, hi); err != nil {
			tw.Stop()
			t.Fatalf("snapshot %s: %v", name, err)
		}
	}
	if err := tw.Stop(); err != nil {
		t.Fatal(err)
	}
}

func testClones(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		_, err := s.st.Clone(context.Background(), "nosnap", "s", "c", store.CreateOptions{})
		if err == nil {
			t.Fatal("Clone of a volume without snapshots succeeded")
		}
		return
	}
	ctx := context.Background()
	const n = 256
	v := s.mustCreate("o", n*bs)
	defer v.Close()
	a := Pattern(0, n, 1)
	mustWrite(t, v, 0, a)
	mustSnap(t, s, "o", "s")
	info, err := s.st.Clone(ctx, "o", "s", "c", store.CreateOptions{Meta: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "c" || info.Size != n*bs || info.Origin != "o@s" || info.Meta["k"] != "v" || info.ID == 0 {
		t.Fatalf("clone info %+v", info)
	}
	c := s.mustOpen("c")
	defer c.Close()
	equalBlocks(t, "new clone", 0, mustRead(t, c, 0, n), a)

	// Writes on either side stay on their side.
	b := Pattern(5, 40, 2)
	mustWrite(t, c, 5, b)
	if err := c.Trim(ctx, 200, 30); err != nil {
		t.Fatal(err)
	}
	cw := slices.Clone(a)
	copy(cw[5*bs:], b)
	clear(cw[200*bs : 230*bs])
	ow := slices.Clone(a)
	d := Pattern(30, 30, 3)
	mustWrite(t, v, 30, d)
	copy(ow[30*bs:], d)
	equalBlocks(t, "clone", 0, mustRead(t, c, 0, n), cw)
	equalBlocks(t, "origin", 0, mustRead(t, v, 0, n), ow)
	equalBlocks(t, "origin snapshot", 0, s.readAll("o@s"), a)
	es := extents(t, c)
	checkHolesReadZeros(t, c, es)
	if holeAt(es, 0) {
		t.Fatalf("clone block 0 (origin data) reported as a hole: %+v", es)
	}

	st := s.stat("o")
	if len(st.Snapshots) != 1 || !slices.Equal(st.Snapshots[0].Clones, []string{"c"}) {
		t.Fatalf("origin snapshots %+v", st.Snapshots)
	}
	if got := s.stat("c").Origin; got != "o@s" {
		t.Fatalf("clone Origin %q", got)
	}
	wantErr(t, "delete a snapshot with a clone", s.st.DeleteSnapshot(ctx, "o", "s"), store.ErrHasDependents)
	v.Close()
	wantErr(t, "delete a volume with a cloned snapshot", s.st.DeleteVolume(ctx, "o"), store.ErrHasDependents)
	_, err = s.st.Clone(ctx, "o", "nope", "c2", store.CreateOptions{})
	wantErr(t, "clone of a missing snapshot", err, store.ErrNotFound)
	_, err = s.st.Clone(ctx, "o", "s", "c", store.CreateOptions{})
	wantErr(t, "clone to a taken name", err, store.ErrExists)
	_, err = s.st.Clone(ctx, "o", "s", "bad@name", store.CreateOptions{})
	wantErr(t, "clone to a bad name", err, store.ErrInvalid)

	// The clone outlives the origin's changes; deleting it frees the
	// snapshot.
	c.Close()
	if err := s.st.DeleteVolume(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := s.st.DeleteSnapshot(ctx, "o", "s"); err != nil {
		t.Fatalf("delete the snapshot after its clone: %v", err)
	}
	equalBlocks(t, "origin at the end", 0, s.readAll("o"), ow)
}

// testCloneChains: a clone of a snapshot of a clone reads through both
// origins.
func testCloneChains(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		return
	}
	ctx := context.Background()
	const n = 128
	v := s.mustCreate("a", n*bs)
	model := Pattern(0, n, 1)
	mustWrite(t, v, 0, model)
	v.Close()
	mustSnap(t, s, "a", "s")
	mustClone(t, s, "a", "s", "b")
	b := s.mustOpen("b")
	p := Pattern(0, 16, 2)
	mustWrite(t, b, 0, p)
	bm := slices.Clone(model)
	copy(bm, p)
	if err := b.Trim(ctx, 64, 8); err != nil {
		t.Fatal(err)
	}
	clear(bm[64*bs : 72*bs])
	b.Close()
	mustSnap(t, s, "b", "s")
	mustClone(t, s, "b", "s", "c")
	c := s.mustOpen("c")
	defer c.Close()
	equalBlocks(t, "clone of a clone", 0, mustRead(t, c, 0, n), bm)
	q := Pattern(100, 10, 3)
	mustWrite(t, c, 100, q)
	cm := slices.Clone(bm)
	copy(cm[100*bs:], q)
	equalBlocks(t, "clone of a clone after a write", 0, mustRead(t, c, 0, n), cm)
	equalBlocks(t, "middle clone", 0, s.readAll("b"), bm)
	equalBlocks(t, "first volume", 0, s.readAll("a"), model)
	checkHolesReadZeros(t, c, extents(t, c))
	wantErr(t, "delete the middle clone's snapshot", s.st.DeleteSnapshot(ctx, "b", "s"), store.ErrHasDependents)
}

func testRollback(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		wantErr(t, "Rollback", s.st.Rollback(context.Background(), "nosnap", "s"), store.ErrNotSupported)
		return
	}
	ctx := context.Background()
	const n = 256
	v := s.mustCreate("r", n*bs)
	a := Pattern(0, n, 1)
	mustWrite(t, v, 0, a)
	mustSnap(t, s, "r", "s1")
	b := slices.Clone(a)
	copy(b[20*bs:], Pattern(20, 30, 2))
	mustWrite(t, v, 20, b[20*bs:50*bs])
	if err := v.Trim(ctx, 200, 56); err != nil {
		t.Fatal(err)
	}
	clear(b[200*bs:])
	mustSnap(t, s, "r", "s2")
	c := slices.Clone(b)
	copy(c[0:], Pattern(0, 100, 3))
	mustWrite(t, v, 0, c[:100*bs])
	wantErr(t, "rollback while open", s.st.Rollback(ctx, "r", "s1"), store.ErrBusy)
	v.Close()
	wantErr(t, "rollback to a missing snapshot", s.st.Rollback(ctx, "r", "nope"), store.ErrNotFound)
	// The errors say which was missing.
	if err := s.st.Rollback(ctx, "nope", "s1"); !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), `volume "nope"`) {
		t.Errorf("rollback of a missing volume: %v, want ErrNotFound naming the volume", err)
	}
	if err := s.st.Rollback(ctx, "r", "nope"); !strings.Contains(err.Error(), "nope") {
		t.Errorf("rollback to a missing snapshot: %v, want it named", err)
	}

	if err := s.st.Rollback(ctx, "r", "s1"); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "head after rollback to s1", 0, s.readAll("r"), a)
	equalBlocks(t, "s1 after rollback", 0, s.readAll("r@s1"), a)
	equalBlocks(t, "s2 after rollback", 0, s.readAll("r@s2"), b)

	// Writes after a rollback copy, they never reach the snapshots.
	v = s.mustOpen("r")
	d := slices.Clone(a)
	copy(d[10*bs:], Pattern(10, 200, 4))
	mustWrite(t, v, 10, d[10*bs:210*bs])
	equalBlocks(t, "head after writing over the rollback", 0, mustRead(t, v, 0, n), d)
	v.Close()
	equalBlocks(t, "s1 after writes", 0, s.readAll("r@s1"), a)
	equalBlocks(t, "s2 after writes", 0, s.readAll("r@s2"), b)

	if err := s.st.Rollback(ctx, "r", "s2"); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "head after rollback to s2", 0, s.readAll("r"), b)
	// Deleting the snapshots after a rollback leaves the head whole.
	if err := s.st.DeleteSnapshot(ctx, "r", "s2"); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "head after deleting s2", 0, s.readAll("r"), b)
	if err := s.st.DeleteSnapshot(ctx, "r", "s1"); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "head after deleting s1", 0, s.readAll("r"), b)
	v = s.mustOpen("r")
	mustWrite(t, v, 0, Pattern(0, n, 5))
	v.Close()
	equalBlocks(t, "head after rewriting", 0, s.readAll("r"), Pattern(0, n, 5))

	if s.o.NoResize {
		return
	}
	// A rollback restores the size too.
	mustSnap(t, s, "r", "small")
	if err := s.st.ResizeVolume(ctx, "r", 2*n*bs); err != nil {
		t.Fatal(err)
	}
	v = s.mustOpen("r")
	mustWrite(t, v, 2*n-1, Pattern(2*n-1, 1, 6))
	v.Close()
	if err := s.st.Rollback(ctx, "r", "small"); err != nil {
		t.Fatal(err)
	}
	if got := s.stat("r").Size; got != n*bs {
		t.Fatalf("size after rollback: %d, want %d", got, n*bs)
	}
	if err := s.st.ResizeVolume(ctx, "r", 2*n*bs); err != nil {
		t.Fatal(err)
	}
	if !IsZero(s.readAll("r")[n*bs:]) {
		t.Fatal("data written past the snapshot's size came back after rollback and grow")
	}

	// A grow racing a rollback to a larger snapshot never cuts what the
	// rollback restores: either the grow lands first, or it sees the
	// rollback's size and refuses (ErrShrink), or it meets the rollback
	// in progress (ErrBusy). The rollback always succeeds.
	v = s.mustOpen("r")
	last := Pattern(2*n-1, 1, 7)
	mustWrite(t, v, 2*n-1, last)
	v.Close()
	mustSnap(t, s, "r", "big")
	for i := range 20 {
		if err := s.st.ResizeVolume(ctx, "r", n*bs); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.st.GrowVolume(ctx, "r", n*bs+n/2*bs)
			if err != nil && !errors.Is(err, store.ErrShrink) && !errors.Is(err, store.ErrBusy) {
				t.Errorf("grow beside a rollback: %v", err)
			}
		}()
		// A grow takes no exclusive hold, so the rollback never meets
		// one.
		err := s.st.Rollback(ctx, "r", "big")
		wg.Wait()
		if err != nil {
			t.Fatalf("rollback beside a grow: %v", err)
		}
		got := s.readAll("r")
		if len(got) != 2*n*bs {
			t.Fatalf("round %d: size %d after the rollback, want the snapshot's %d", i, len(got), 2*n*bs)
		}
		equalBlocks(t, fmt.Sprintf("round %d: the last block after a grow beside a rollback", i), 2*n-1, got[(2*n-1)*bs:], last)
	}
}

// testDeleteSnapshotInTheMiddle deletes snapshots from the middle, the
// start and the end of a chain, with a clone of the first one alive.
func testDeleteSnapshotInTheMiddle(t *testing.T, s *suite) {
	if snapshotsUnsupported(t, s) {
		return
	}
	ctx := context.Background()
	const n = 256
	v := s.mustCreate("m", n*bs)
	defer v.Close()
	cur := make([]byte, n*bs)
	states := map[string][]byte{}
	for i, name := range []string{"s1", "s2", "s3", "s4"} {
		lba := uint64(i * 40)
		p := Pattern(lba, 80, uint64(i+1))
		mustWrite(t, v, lba, p)
		copy(cur[lba*bs:], p)
		if i == 2 {
			if err := v.Trim(ctx, 0, 20); err != nil {
				t.Fatal(err)
			}
			clear(cur[:20*bs])
		}
		mustSnap(t, s, "m", name)
		states[name] = slices.Clone(cur)
	}
	p := Pattern(0, n, 9)
	mustWrite(t, v, 0, p[:128*bs])
	copy(cur, p[:128*bs])
	mustClone(t, s, "m", "s1", "k")
	check := func(when string) {
		t.Helper()
		for name, want := range states {
			equalBlocks(t, when+": m@"+name, 0, s.readAll("m@"+name), want)
		}
		equalBlocks(t, when+": head", 0, mustRead(t, v, 0, n), cur)
		equalBlocks(t, when+": clone of s1", 0, s.readAll("k"), states["s1"])
	}
	check("before")
	for _, name := range []string{"s3", "s2", "s4"} {
		if err := s.st.DeleteSnapshot(ctx, "m", name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
		delete(states, name)
		check("after deleting " + name)
	}
	if got := s.stat("m").Snapshots; len(got) != 1 || got[0].Name != "s1" {
		t.Fatalf("snapshots left: %+v", got)
	}
}

func testSpaceAccounting(t *testing.T, s *suite) {
	ctx := context.Background()
	const size, chunk = 16 * mib, 4 * mib
	v := s.mustCreate("sp", size)
	defer v.Close()
	if st := s.stat("sp"); st.Allocated != 0 || st.Exclusive != 0 {
		t.Fatalf("a new volume: allocated %d, exclusive %d", st.Allocated, st.Exclusive)
	}
	mustWrite(t, v, 0, Pattern(0, chunk/bs, 1))
	st := s.stat("sp")
	if st.Allocated < chunk || st.Allocated > size {
		t.Fatalf("after writing %d bytes: allocated %d", chunk, st.Allocated)
	}
	if s.o.NoSnapshots {
		if err := v.Trim(ctx, 0, chunk/bs); err != nil {
			t.Fatal(err)
		}
		if st := s.stat("sp"); st.Allocated != 0 {
			t.Fatalf("after trimming everything: allocated %d", st.Allocated)
		}
		return
	}
	if st.Exclusive != st.Allocated {
		t.Fatalf("without snapshots: allocated %d, exclusive %d", st.Allocated, st.Exclusive)
	}
	mustSnap(t, s, "sp", "s")
	st = s.stat("sp")
	if st.Exclusive != 0 || st.Snapshots[0].Exclusive != 0 {
		t.Fatalf("right after a snapshot: head exclusive %d, snapshot exclusive %d", st.Exclusive, st.Snapshots[0].Exclusive)
	}
	mustWrite(t, v, 0, Pattern(0, chunk/bs, 2))
	st = s.stat("sp")
	if st.Exclusive < chunk || st.Snapshots[0].Exclusive < chunk {
		t.Fatalf("after overwriting: head exclusive %d, snapshot exclusive %d, want >= %d",
			st.Exclusive, st.Snapshots[0].Exclusive, chunk)
	}
	if err := v.Trim(ctx, 0, size/bs); err != nil {
		t.Fatal(err)
	}
	st = s.stat("sp")
	if st.Allocated != 0 || st.Exclusive != 0 || st.Snapshots[0].Exclusive < chunk {
		t.Fatalf("after trimming the head: allocated %d, exclusive %d, snapshot exclusive %d",
			st.Allocated, st.Exclusive, st.Snapshots[0].Exclusive)
	}
	if err := s.st.DeleteSnapshot(ctx, "sp", "s"); err != nil {
		t.Fatal(err)
	}
}
