package storetest

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
)

// The basic contract: volumes, blocks, ranges, errors.

func testCreateOpenList(t *testing.T, s *suite) {
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	meta := map[string]string{"owner": "alice", "purpose": "test"}
	a, err := s.st.CreateVolume(ctx, "vol-a", 1<<20, store.CreateOptions{Meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	meta["owner"] = "mallory" // the store keeps its own copy
	b, err := s.st.CreateVolume(ctx, "vol-b", 64*bs, store.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "vol-a" || a.Size != 1<<20 || a.Meta["owner"] != "alice" || len(a.Meta) != 2 {
		t.Fatalf("created info %+v", a)
	}
	if a.ID == 0 || b.ID == 0 || a.ID == b.ID {
		t.Fatalf("ids %d and %d: want distinct, non-zero", a.ID, b.ID)
	}
	if a.Created.Before(before) || a.Created.After(time.Now().Add(time.Second)) {
		t.Fatalf("Created %v is not about now", a.Created)
	}
	if a.Blocks() != 256 {
		t.Fatalf("Blocks() = %d, want 256", a.Blocks())
	}

	v, err := s.st.OpenVolume(ctx, "vol-a")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	got := v.Info()
	if got.Name != a.Name || got.ID != a.ID || got.Size != a.Size || !got.Created.Equal(a.Created) || got.Meta["owner"] != "alice" {
		t.Fatalf("Info() = %+v, want %+v", got, a)
	}
	got.Meta["owner"] = "eve"
	if v.Info().Meta["owner"] != "alice" {
		t.Fatal("Info().Meta aliases the handle's map")
	}

	list, err := s.st.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "vol-a" || list[1].Name != "vol-b" {
		t.Fatalf("ListVolumes = %+v", list)
	}
	if list[0].ID != a.ID || list[1].ID != b.ID || list[1].Size != 64*bs || list[0].Meta["purpose"] != "test" {
		t.Fatalf("ListVolumes = %+v", list)
	}
}

func testCreateInvalid(t *testing.T, s *suite) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		size int64
	}{
		{"zero", 0},
		{"negative", -bs},
		{"unaligned", bs + 1},
		{"half", bs / 2},
		{"", bs},
		{strings.Repeat("x", store.MaxNameLen+1), bs},
		{"new\nline", bs},
		{"bad\xffutf8", bs},
	} {
		_, err := s.st.CreateVolume(ctx, c.name, c.size, store.CreateOptions{})
		wantErr(t, "CreateVolume("+c.name+")", err, store.ErrInvalid)
	}
	for _, meta := range []map[string]string{
		{"k": "bad\xff"},
		{"bad\xfe": "v"},
		{"big": strings.Repeat("m", store.MaxMetaLen)},
	} {
		_, err := s.st.CreateVolume(ctx, "meta", bs, store.CreateOptions{Meta: meta})
		wantErr(t, "CreateVolume with bad meta", err, store.ErrInvalid)
	}
	if list, err := s.st.ListVolumes(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after invalid creates: %v, %v", list, err)
	}
	if _, err := s.st.CreateVolume(ctx, strings.Repeat("x", store.MaxNameLen), bs, store.CreateOptions{}); err != nil {
		t.Fatalf("longest name: %v", err)
	}
}

func testCreateExisting(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("data", 16*bs)
	data := Pattern(0, 16, 7)
	mustWrite(t, v, 0, data)
	v.Close()
	_, err := s.st.CreateVolume(ctx, "data", 32*bs, store.CreateOptions{Meta: map[string]string{"x": "y"}})
	wantErr(t, "CreateVolume on existing name", err, store.ErrExists)
	v, err = s.st.OpenVolume(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if info := v.Info(); info.Size != 16*bs || len(info.Meta) != 0 {
		t.Fatalf("existing volume changed: %+v", info)
	}
	equalBlocks(t, "data after failed create", 0, mustRead(t, v, 0, 16), data)
}

func testNotFound(t *testing.T, s *suite) {
	ctx := context.Background()
	_, err := s.st.OpenVolume(ctx, "nope")
	wantErr(t, "OpenVolume", err, store.ErrNotFound)
	wantErr(t, "DeleteVolume", s.st.DeleteVolume(ctx, "nope"), store.ErrNotFound)
}

func testDeleteBusyAndRecreate(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("d", 64*bs)
	old := v.Info()
	mustWrite(t, v, 0, Pattern(0, 64, 3))
	v2, err := s.st.OpenVolume(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "DeleteVolume with two handles", s.st.DeleteVolume(ctx, "d"), store.ErrBusy)
	v.Close()
	wantErr(t, "DeleteVolume with one handle", s.st.DeleteVolume(ctx, "d"), store.ErrBusy)
	v2.Close()
	if err := s.st.DeleteVolume(ctx, "d"); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	_, err = s.st.OpenVolume(ctx, "d")
	wantErr(t, "OpenVolume after delete", err, store.ErrNotFound)
	if list, _ := s.st.ListVolumes(ctx); len(list) != 0 {
		t.Fatalf("ListVolumes after delete: %+v", list)
	}

	// The name is free again, with a new id and no old data.
	v = s.mustCreate("d", 64*bs)
	defer v.Close()
	if v.Info().ID == old.ID {
		t.Fatalf("recreated volume reuses id %d", old.ID)
	}
	if got := mustRead(t, v, 0, 64); !IsZero(got) {
		t.Fatal("recreated volume shows data of the deleted one")
	}
}

func testUnwrittenReadsZeros(t *testing.T, s *suite) {
	v := s.mustCreate("z", 1<<20)
	defer v.Close()
	if !IsZero(mustRead(t, v, 0, 256)) {
		t.Fatal("new volume does not read as zeros")
	}
	mustWrite(t, v, 10, Pattern(10, 1, 1))
	got := mustRead(t, v, 8, 5)
	if !IsZero(got[:2*bs]) || !IsZero(got[3*bs:]) {
		t.Fatal("blocks around a written one are not zero")
	}
	equalBlocks(t, "written block", 10, got[2*bs:3*bs], Pattern(10, 1, 1))
}

func testMultiBlockWrites(t *testing.T, s *suite) {
	const blocks = 4096 // 16 MiB
	v := s.mustCreate("m", blocks*bs)
	defer v.Close()
	model := make([]byte, blocks*bs)
	write := func(lba uint64, n int, tag uint64) {
		p := Pattern(lba, n, tag)
		mustWrite(t, v, lba, p)
		copy(model[lba*bs:], p)
	}
	write(0, 1, 1)
	write(1, 7, 2)
	write(4, 8, 3)        // overlaps the previous write
	write(100, 2048, 4)   // 8 MiB in one request
	write(blocks-3, 3, 5) // ends at the last block
	write(50, 100, 6)     // overlaps the start of the big one
	equalBlocks(t, "whole volume", 0, mustRead(t, v, 0, blocks), model)
	equalBlocks(t, "middle range", 120, mustRead(t, v, 120, 33), model[120*bs:153*bs])
	equalBlocks(t, "last block", blocks-1, mustRead(t, v, blocks-1, 1), model[(blocks-1)*bs:])
}

func testOutOfRange(t *testing.T, s *suite) {
	ctx := context.Background()
	const n = 16
	v := s.mustCreate("r", n*bs)
	defer v.Close()
	one := make([]byte, bs)
	two := make([]byte, 2*bs)
	for _, c := range []struct {
		lba uint64
		buf []byte
	}{
		{n, one},
		{n - 1, two},
		{n + 1, nil},
		{math.MaxUint64, one},
		{math.MaxUint64 - 1, two}, // lba+count wraps to 0
		{math.MaxUint64, nil},
		{1 << 63, one},
	} {
		err := v.ReadBlocks(ctx, c.lba, c.buf)
		wantErr(t, "ReadBlocks", err, store.ErrOutOfRange)
		var oe *store.OpError
		if !errors.As(err, &oe) || oe.Op != "read" || oe.Volume != "r" || oe.LBA != c.lba {
			t.Fatalf("ReadBlocks(%d): error %v lacks context", c.lba, err)
		}
		wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, c.lba, c.buf, false), store.ErrOutOfRange)
	}
	for _, c := range [][2]uint64{
		{0, n + 1},
		{1, n},
		{n, 1},
		{1, math.MaxUint64},     // count alone exceeds
		{math.MaxUint64, 1},     // lba alone exceeds
		{2, math.MaxUint64 - 1}, // lba+count wraps to 0
		{math.MaxUint64, math.MaxUint64},
	} {
		wantErr(t, "Trim", v.Trim(ctx, c[0], c[1]), store.ErrOutOfRange)
		wantErr(t, "WriteZeroes", v.WriteZeroes(ctx, c[0], c[1], false), store.ErrOutOfRange)
	}
	// Failed requests changed nothing; requests touching the end are fine.
	if !IsZero(mustRead(t, v, 0, n)) {
		t.Fatal("an out-of-range request wrote data")
	}
	mustWrite(t, v, n-2, Pattern(n-2, 2, 9))
	if err := v.ReadBlocks(ctx, n, nil); err != nil {
		t.Fatalf("empty read at the end: %v", err)
	}
	if err := v.Trim(ctx, n, 0); err != nil {
		t.Fatalf("empty trim at the end: %v", err)
	}
	if err := v.Trim(ctx, 0, n); err != nil {
		t.Fatalf("trim of the whole volume: %v", err)
	}
}

func testUnaligned(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("u", 16*bs)
	defer v.Close()
	for _, size := range []int{1, bs - 1, bs + 1, 3*bs + 512} {
		buf := make([]byte, size)
		wantErr(t, "ReadBlocks unaligned", v.ReadBlocks(ctx, 0, buf), store.ErrInvalid)
		wantErr(t, "WriteBlocks unaligned", v.WriteBlocks(ctx, 0, buf, false), store.ErrInvalid)
	}
}

func testTrimAndWriteZeroes(t *testing.T, s *suite) {
	ctx := context.Background()
	const n = 512
	v := s.mustCreate("t", n*bs)
	defer v.Close()
	model := Pattern(0, n, 11)
	mustWrite(t, v, 0, model)
	zero := func(lba, count uint64) { clear(model[lba*bs : (lba+count)*bs]) }

	if err := v.Trim(ctx, 10, 20); err != nil {
		t.Fatal(err)
	}
	zero(10, 20)
	if err := v.WriteZeroes(ctx, 100, 1, false); err != nil {
		t.Fatal(err)
	}
	zero(100, 1)
	if err := v.WriteZeroes(ctx, 200, 50, true); err != nil {
		t.Fatal(err)
	}
	zero(200, 50)
	if err := v.Trim(ctx, 15, 10); err != nil { // already trimmed
		t.Fatal(err)
	}
	equalBlocks(t, "after trims", 0, mustRead(t, v, 0, n), model)

	// Rewrite part of a trimmed range.
	p := Pattern(12, 4, 12)
	mustWrite(t, v, 12, p)
	copy(model[12*bs:], p)
	equalBlocks(t, "after rewrite", 0, mustRead(t, v, 0, n), model)

	if err := v.Trim(ctx, 0, n); err != nil {
		t.Fatal(err)
	}
	if !IsZero(mustRead(t, v, 0, n)) {
		t.Fatal("whole-volume trim left data")
	}
}

func testFlushAndFUA(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("f", 64*bs)
	defer v.Close()
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("Flush of an empty volume: %v", err)
	}
	p := Pattern(5, 3, 13)
	if err := v.WriteBlocks(ctx, 5, p, true); err != nil {
		t.Fatalf("FUA write: %v", err)
	}
	if err := v.WriteBlocks(ctx, 0, nil, true); err != nil {
		t.Fatalf("empty FUA write: %v", err)
	}
	equalBlocks(t, "FUA data", 5, mustRead(t, v, 5, 3), p)
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func testVolumesIsolated(t *testing.T, s *suite) {
	a := s.mustCreate("a", 32*bs)
	defer a.Close()
	b := s.mustCreate("b", 32*bs)
	defer b.Close()
	pa, pb := Pattern(0, 32, 21), Pattern(0, 32, 22)
	mustWrite(t, a, 0, pa)
	mustWrite(t, b, 0, pb)
	if err := b.Trim(context.Background(), 0, 16); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "volume a", 0, mustRead(t, a, 0, 32), pa)
	clear(pb[:16*bs])
	equalBlocks(t, "volume b", 0, mustRead(t, b, 0, 32), pb)
}

// badRequest is a request every Volume method refuses.
type badRequest struct {
	what string
	lba  uint64
	buf  []byte
}

// badRequests are the refused requests on a volume of n blocks.
func badRequests(n uint64) []badRequest {
	return []badRequest{
		{"past the end", n, make([]byte, bs)},
		{"across the end", n - 1, make([]byte, 2*bs)},
		{"an lba that overflows", ^uint64(0), make([]byte, bs)},
		{"an unaligned buffer", 0, make([]byte, bs+1)},
		{"an empty buffer", 0, nil},
	}
}

// testTryReadBlocks: TryReadBlocks reads what ReadBlocks reads, or
// declines; it declines what ReadBlocks refuses; a store in memory never
// declines a valid read.
func testTryReadBlocks(t *testing.T, s *suite) {
	const n = 64
	v := s.mustCreate("t", n*bs)
	mustWrite(t, v, 10, Pattern(10, 1, 1))
	mustWrite(t, v, 32, Pattern(32, 20, 2))
	want := mustRead(t, v, 0, n)
	for _, c := range []struct{ lba, blocks uint64 }{{0, 1}, {10, 1}, {8, 4}, {32, 20}, {40, 1}, {60, 4}, {0, n}} {
		buf := make([]byte, c.blocks*bs)
		ok := v.TryReadBlocks(c.lba, buf)
		if ok {
			equalBlocks(t, "TryReadBlocks", c.lba, buf, want[c.lba*bs:(c.lba+c.blocks)*bs])
		} else if v.InMemory() {
			t.Errorf("TryReadBlocks(%d, %d blocks) declined on a volume in memory", c.lba, c.blocks)
		}
	}
	for _, c := range badRequests(n) {
		if v.TryReadBlocks(c.lba, c.buf) {
			t.Errorf("TryReadBlocks of %s read", c.what)
		}
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if v.TryReadBlocks(0, make([]byte, bs)) {
		t.Error("TryReadBlocks on a closed handle read")
	}
}

// testTryWriteBlocks: TryWriteBlocks writes what WriteBlocks writes, or
// declines (the caller then writes with WriteBlocks); it declines what
// WriteBlocks refuses and changes nothing then; a store in memory never
// declines a valid write.
func testTryWriteBlocks(t *testing.T, s *suite) {
	const n = 64
	v := s.mustCreate("t", n*bs)
	mustWrite(t, v, 0, Pattern(0, n, 1)) // every block allocated
	want := mustRead(t, v, 0, n)
	for i, c := range []struct{ lba, blocks uint64 }{{0, 1}, {10, 1}, {8, 4}, {32, 20}, {15, 2}, {60, 4}, {0, n}} {
		src := Pattern(c.lba, int(c.blocks), uint64(i+2))
		if !v.TryWriteBlocks(c.lba, src) {
			if v.InMemory() {
				t.Errorf("TryWriteBlocks(%d, %d blocks) declined on a volume in memory", c.lba, c.blocks)
			}
			mustWrite(t, v, c.lba, src)
		}
		copy(want[c.lba*bs:], src)
		equalBlocks(t, "after TryWriteBlocks", 0, mustRead(t, v, 0, n), want)
	}
	for _, c := range badRequests(n) {
		if v.TryWriteBlocks(c.lba, c.buf) {
			t.Errorf("TryWriteBlocks of %s wrote", c.what)
		}
	}
	equalBlocks(t, "after refused TryWriteBlocks", 0, mustRead(t, v, 0, n), want)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if v.TryWriteBlocks(0, make([]byte, bs)) {
		t.Error("TryWriteBlocks on a closed handle wrote")
	}
	if !snapshotsUnsupported(t, s) {
		mustSnap(t, s, "t", "s")
		sv, err := s.st.OpenVolume(context.Background(), "t@s")
		if err != nil {
			t.Fatal(err)
		}
		defer sv.Close()
		if sv.TryWriteBlocks(0, make([]byte, bs)) {
			t.Error("TryWriteBlocks on a snapshot handle wrote")
		}
		equalBlocks(t, "the snapshot", 0, mustRead(t, sv, 0, n), want)
	}
}

func testClosedVolume(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("c", 16*bs)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second Close", v.Close(), store.ErrClosed)
	buf := make([]byte, bs)
	wantErr(t, "ReadBlocks", v.ReadBlocks(ctx, 0, buf), store.ErrClosed)
	wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, 0, buf, false), store.ErrClosed)
	wantErr(t, "Flush", v.Flush(ctx), store.ErrClosed)
	wantErr(t, "Trim", v.Trim(ctx, 0, 1), store.ErrClosed)
	wantErr(t, "WriteZeroes", v.WriteZeroes(ctx, 0, 1, false), store.ErrClosed)
	if v.Info().Name != "c" {
		t.Fatal("Info of a closed handle")
	}
}

func testClosedStore(t *testing.T, s *suite) {
	ctx := context.Background()
	v := s.mustCreate("c", 16*bs)
	if err := s.st.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second store Close", s.st.Close(), store.ErrClosed)
	wantErr(t, "ReadBlocks after store Close", v.ReadBlocks(ctx, 0, make([]byte, bs)), store.ErrClosed)
	wantErr(t, "Volume Close after store Close", v.Close(), store.ErrClosed)
	_, err := s.st.CreateVolume(ctx, "x", bs, store.CreateOptions{})
	wantErr(t, "CreateVolume", err, store.ErrClosed)
	_, err = s.st.OpenVolume(ctx, "c")
	wantErr(t, "OpenVolume", err, store.ErrClosed)
	_, err = s.st.ListVolumes(ctx)
	wantErr(t, "ListVolumes", err, store.ErrClosed)
	wantErr(t, "DeleteVolume", s.st.DeleteVolume(ctx, "c"), store.ErrClosed)
	wantErr(t, "Sync", s.st.Sync(ctx), store.ErrClosed)
}

func testCancelledContext(t *testing.T, s *suite) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := s.mustCreate("x", 16*bs)
	defer v.Close()
	buf := make([]byte, bs)
	wantErr(t, "ReadBlocks", v.ReadBlocks(ctx, 0, buf), context.Canceled)
	wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, 0, buf, false), context.Canceled)
	wantErr(t, "Trim", v.Trim(ctx, 0, 1), context.Canceled)
	_, err := s.st.CreateVolume(ctx, "y", bs, store.CreateOptions{})
	wantErr(t, "CreateVolume", err, context.Canceled)
	_, err = s.st.OpenVolume(ctx, "x")
	wantErr(t, "OpenVolume", err, context.Canceled)
}
