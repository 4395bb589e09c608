package store

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// storeFactory opens a new, empty Store for one test; the test closes it.
type storeFactory func(t *testing.T) Store

// runConformance checks the Store and Volume contract against a backend.
func runConformance(t *testing.T, open storeFactory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"CreateOpenList", testCreateOpenList},
		{"CreateInvalid", testCreateInvalid},
		{"CreateExisting", testCreateExisting},
		{"NotFound", testNotFound},
		{"DeleteBusyAndRecreate", testDeleteBusyAndRecreate},
		{"UnwrittenReadsZeros", testUnwrittenReadsZeros},
		{"MultiBlockWrites", testMultiBlockWrites},
		{"OutOfRange", testOutOfRange},
		{"Unaligned", testUnaligned},
		{"TrimAndWriteZeroes", testTrimAndWriteZeroes},
		{"FlushAndFUA", testFlushAndFUA},
		{"VolumesIsolated", testVolumesIsolated},
		{"ClosedVolume", testClosedVolume},
		{"ClosedStore", testClosedStore},
		{"CancelledContext", testCancelledContext},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			tc.fn(t, s)
			if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

func testCreateOpenList(t *testing.T, s Store) {
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	meta := map[string]string{"owner": "alice", "purpose": "test"}
	a, err := s.CreateVolume(ctx, "vol-a", 1<<20, meta)
	if err != nil {
		t.Fatal(err)
	}
	meta["owner"] = "mallory" // the store keeps its own copy
	b, err := s.CreateVolume(ctx, "vol-b", 64*BlockSize, nil)
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

	v, err := s.OpenVolume(ctx, "vol-a")
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

	list, err := s.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "vol-a" || list[1].Name != "vol-b" {
		t.Fatalf("ListVolumes = %+v", list)
	}
	if list[0].ID != a.ID || list[1].ID != b.ID || list[1].Size != 64*BlockSize || list[0].Meta["purpose"] != "test" {
		t.Fatalf("ListVolumes = %+v", list)
	}
}

func testCreateInvalid(t *testing.T, s Store) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		size int64
	}{
		{"zero", 0},
		{"negative", -BlockSize},
		{"unaligned", BlockSize + 1},
		{"half", BlockSize / 2},
		{"", BlockSize},
		{strings.Repeat("x", MaxNameLen+1), BlockSize},
		{"new\nline", BlockSize},
		{"bad\xffutf8", BlockSize},
	} {
		_, err := s.CreateVolume(ctx, c.name, c.size, nil)
		wantErr(t, "CreateVolume("+c.name+")", err, ErrInvalid)
	}
	for _, meta := range []map[string]string{
		{"k": "bad\xff"},
		{"bad\xfe": "v"},
		{"big": strings.Repeat("m", MaxMetaLen)},
	} {
		_, err := s.CreateVolume(ctx, "meta", BlockSize, meta)
		wantErr(t, "CreateVolume with bad meta", err, ErrInvalid)
	}
	if list, err := s.ListVolumes(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after invalid creates: %v, %v", list, err)
	}
	if _, err := s.CreateVolume(ctx, strings.Repeat("x", MaxNameLen), BlockSize, nil); err != nil {
		t.Fatalf("longest name: %v", err)
	}
}

func testCreateExisting(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "data", 16*BlockSize)
	data := patternBlocks(0, 16, 7)
	mustWrite(t, v, 0, data)
	v.Close()
	_, err := s.CreateVolume(ctx, "data", 32*BlockSize, map[string]string{"x": "y"})
	wantErr(t, "CreateVolume on existing name", err, ErrExists)
	v, err = s.OpenVolume(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if info := v.Info(); info.Size != 16*BlockSize || len(info.Meta) != 0 {
		t.Fatalf("existing volume changed: %+v", info)
	}
	equalBlocks(t, "data after failed create", 0, mustRead(t, v, 0, 16), data)
}

func testNotFound(t *testing.T, s Store) {
	ctx := context.Background()
	_, err := s.OpenVolume(ctx, "nope")
	wantErr(t, "OpenVolume", err, ErrNotFound)
	wantErr(t, "DeleteVolume", s.DeleteVolume(ctx, "nope"), ErrNotFound)
}

func testDeleteBusyAndRecreate(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "d", 64*BlockSize)
	old := v.Info()
	mustWrite(t, v, 0, patternBlocks(0, 64, 3))
	v2, err := s.OpenVolume(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "DeleteVolume with two handles", s.DeleteVolume(ctx, "d"), ErrBusy)
	v.Close()
	wantErr(t, "DeleteVolume with one handle", s.DeleteVolume(ctx, "d"), ErrBusy)
	v2.Close()
	if err := s.DeleteVolume(ctx, "d"); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	_, err = s.OpenVolume(ctx, "d")
	wantErr(t, "OpenVolume after delete", err, ErrNotFound)
	if list, _ := s.ListVolumes(ctx); len(list) != 0 {
		t.Fatalf("ListVolumes after delete: %+v", list)
	}

	// The name is free again, with a new id and no old data.
	v = mustCreate(t, s, "d", 64*BlockSize)
	defer v.Close()
	if v.Info().ID == old.ID {
		t.Fatalf("recreated volume reuses id %d", old.ID)
	}
	if got := mustRead(t, v, 0, 64); !isZero(got) {
		t.Fatal("recreated volume shows data of the deleted one")
	}
}

func testUnwrittenReadsZeros(t *testing.T, s Store) {
	v := mustCreate(t, s, "z", 1<<20)
	defer v.Close()
	if !isZero(mustRead(t, v, 0, 256)) {
		t.Fatal("new volume does not read as zeros")
	}
	mustWrite(t, v, 10, patternBlocks(10, 1, 1))
	got := mustRead(t, v, 8, 5)
	if !isZero(got[:2*BlockSize]) || !isZero(got[3*BlockSize:]) {
		t.Fatal("blocks around a written one are not zero")
	}
	equalBlocks(t, "written block", 10, got[2*BlockSize:3*BlockSize], patternBlocks(10, 1, 1))
}

func testMultiBlockWrites(t *testing.T, s Store) {
	const blocks = 4096 // 16 MiB
	v := mustCreate(t, s, "m", blocks*BlockSize)
	defer v.Close()
	model := make([]byte, blocks*BlockSize)
	write := func(lba uint64, n int, tag uint64) {
		p := patternBlocks(lba, n, tag)
		mustWrite(t, v, lba, p)
		copy(model[lba*BlockSize:], p)
	}
	write(0, 1, 1)
	write(1, 7, 2)
	write(4, 8, 3)        // overlaps the previous write
	write(100, 2048, 4)   // 8 MiB in one request
	write(blocks-3, 3, 5) // ends at the last block
	write(50, 100, 6)     // overlaps the start of the big one
	equalBlocks(t, "whole volume", 0, mustRead(t, v, 0, blocks), model)
	equalBlocks(t, "middle range", 120, mustRead(t, v, 120, 33), model[120*BlockSize:153*BlockSize])
	equalBlocks(t, "last block", blocks-1, mustRead(t, v, blocks-1, 1), model[(blocks-1)*BlockSize:])
}

func testOutOfRange(t *testing.T, s Store) {
	ctx := context.Background()
	const n = 16
	v := mustCreate(t, s, "r", n*BlockSize)
	defer v.Close()
	one := make([]byte, BlockSize)
	two := make([]byte, 2*BlockSize)
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
		wantErr(t, "ReadBlocks", err, ErrOutOfRange)
		var oe *OpError
		if !errors.As(err, &oe) || oe.Op != "read" || oe.Volume != "r" || oe.LBA != c.lba {
			t.Fatalf("ReadBlocks(%d): error %v lacks context", c.lba, err)
		}
		wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, c.lba, c.buf, false), ErrOutOfRange)
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
		wantErr(t, "Trim", v.Trim(ctx, c[0], c[1]), ErrOutOfRange)
		wantErr(t, "WriteZeroes", v.WriteZeroes(ctx, c[0], c[1], false), ErrOutOfRange)
	}
	// Failed requests changed nothing; requests touching the end are fine.
	if !isZero(mustRead(t, v, 0, n)) {
		t.Fatal("an out-of-range request wrote data")
	}
	mustWrite(t, v, n-2, patternBlocks(n-2, 2, 9))
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

func testUnaligned(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "u", 16*BlockSize)
	defer v.Close()
	for _, size := range []int{1, BlockSize - 1, BlockSize + 1, 3*BlockSize + 512} {
		buf := make([]byte, size)
		wantErr(t, "ReadBlocks unaligned", v.ReadBlocks(ctx, 0, buf), ErrInvalid)
		wantErr(t, "WriteBlocks unaligned", v.WriteBlocks(ctx, 0, buf, false), ErrInvalid)
	}
}

func testTrimAndWriteZeroes(t *testing.T, s Store) {
	ctx := context.Background()
	const n = 512
	v := mustCreate(t, s, "t", n*BlockSize)
	defer v.Close()
	model := patternBlocks(0, n, 11)
	mustWrite(t, v, 0, model)
	zero := func(lba, count uint64) { clear(model[lba*BlockSize : (lba+count)*BlockSize]) }

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
	p := patternBlocks(12, 4, 12)
	mustWrite(t, v, 12, p)
	copy(model[12*BlockSize:], p)
	equalBlocks(t, "after rewrite", 0, mustRead(t, v, 0, n), model)

	if err := v.Trim(ctx, 0, n); err != nil {
		t.Fatal(err)
	}
	if !isZero(mustRead(t, v, 0, n)) {
		t.Fatal("whole-volume trim left data")
	}
}

func testFlushAndFUA(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "f", 64*BlockSize)
	defer v.Close()
	if err := v.Flush(ctx); err != nil {
		t.Fatalf("Flush of an empty volume: %v", err)
	}
	p := patternBlocks(5, 3, 13)
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
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func testVolumesIsolated(t *testing.T, s Store) {
	a := mustCreate(t, s, "a", 32*BlockSize)
	defer a.Close()
	b := mustCreate(t, s, "b", 32*BlockSize)
	defer b.Close()
	pa, pb := patternBlocks(0, 32, 21), patternBlocks(0, 32, 22)
	mustWrite(t, a, 0, pa)
	mustWrite(t, b, 0, pb)
	if err := b.Trim(context.Background(), 0, 16); err != nil {
		t.Fatal(err)
	}
	equalBlocks(t, "volume a", 0, mustRead(t, a, 0, 32), pa)
	clear(pb[:16*BlockSize])
	equalBlocks(t, "volume b", 0, mustRead(t, b, 0, 32), pb)
}

func testClosedVolume(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "c", 16*BlockSize)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second Close", v.Close(), ErrClosed)
	buf := make([]byte, BlockSize)
	wantErr(t, "ReadBlocks", v.ReadBlocks(ctx, 0, buf), ErrClosed)
	wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, 0, buf, false), ErrClosed)
	wantErr(t, "Flush", v.Flush(ctx), ErrClosed)
	wantErr(t, "Trim", v.Trim(ctx, 0, 1), ErrClosed)
	wantErr(t, "WriteZeroes", v.WriteZeroes(ctx, 0, 1, false), ErrClosed)
	if v.Info().Name != "c" {
		t.Fatal("Info of a closed handle")
	}
}

func testClosedStore(t *testing.T, s Store) {
	ctx := context.Background()
	v := mustCreate(t, s, "c", 16*BlockSize)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second store Close", s.Close(), ErrClosed)
	wantErr(t, "ReadBlocks after store Close", v.ReadBlocks(ctx, 0, make([]byte, BlockSize)), ErrClosed)
	wantErr(t, "Volume Close after store Close", v.Close(), ErrClosed)
	_, err := s.CreateVolume(ctx, "x", BlockSize, nil)
	wantErr(t, "CreateVolume", err, ErrClosed)
	_, err = s.OpenVolume(ctx, "c")
	wantErr(t, "OpenVolume", err, ErrClosed)
	_, err = s.ListVolumes(ctx)
	wantErr(t, "ListVolumes", err, ErrClosed)
	wantErr(t, "DeleteVolume", s.DeleteVolume(ctx, "c"), ErrClosed)
	wantErr(t, "Sync", s.Sync(ctx), ErrClosed)
}

func testCancelledContext(t *testing.T, s Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := mustCreate(t, s, "x", 16*BlockSize)
	defer v.Close()
	buf := make([]byte, BlockSize)
	wantErr(t, "ReadBlocks", v.ReadBlocks(ctx, 0, buf), context.Canceled)
	wantErr(t, "WriteBlocks", v.WriteBlocks(ctx, 0, buf, false), context.Canceled)
	wantErr(t, "Trim", v.Trim(ctx, 0, 1), context.Canceled)
	_, err := s.CreateVolume(ctx, "y", BlockSize, nil)
	wantErr(t, "CreateVolume", err, context.Canceled)
	_, err = s.OpenVolume(ctx, "x")
	wantErr(t, "OpenVolume", err, context.Canceled)
}
