// Package storetest is the conformance suite of the store.Store contract:
// Run checks a backend against it. The package store tests run it over the
// memory and thin stores and over raw volumes; another backend (rbd) runs it
// from its own tests.
package storetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

const bs = store.BlockSize

// Options describe the backend under test.
type Options struct {
	// Open returns a new, empty store for one test; the test closes it.
	Open func(t *testing.T) store.Store
	// Create, if set, gives the size argument and options CreateVolume is
	// called with to make a volume of size bytes in a test (the raw suite
	// makes a file here). Unset: size and no options.
	Create func(t *testing.T, name string, size int64) (int64, store.CreateOptions)
	// NoSnapshots: the volumes the suite creates have no snapshots or
	// clones; the suite expects ErrNotSupported from those calls.
	NoSnapshots bool
	// NoResize: ResizeVolume and GrowVolume are expected to fail with
	// ErrNotSupported (a grow below the size: ErrShrink), except to the
	// volume's own size, which succeeds and changes nothing.
	NoResize bool
}

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, o Options) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *suite)
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
		{"TryReadBlocks", testTryReadBlocks},
		{"TryWriteBlocks", testTryWriteBlocks},
		{"ClosedVolume", testClosedVolume},
		{"ClosedStore", testClosedStore},
		{"CancelledContext", testCancelledContext},
		{"BlockStatus", testBlockStatus},
		{"WriteZeroesAllocated", testWriteZeroesAllocated},
		{"SetMetaAndStat", testSetMetaAndStat},
		{"Resize", testResize},
		{"Snapshots", testSnapshots},
		{"SnapshotOfOpenVolume", testSnapshotOfOpenVolume},
		{"SnapshotNames", testSnapshotNames},
		{"Clones", testClones},
		{"CloneChains", testCloneChains},
		{"Rollback", testRollback},
		{"DeleteSnapshotInTheMiddle", testDeleteSnapshotInTheMiddle},
		{"SpaceAccounting", testSpaceAccounting},
		{"RandomConcurrent", testRandomConcurrent},
		{"AtomicWrites", testAtomicWrites},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &suite{t: t, o: o, st: o.Open(t)}
			defer func() {
				if err := s.st.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
					t.Errorf("Close: %v", err)
				}
			}()
			tc.fn(t, s)
		})
	}
}

// suite is one test's store and options.
type suite struct {
	t  *testing.T
	o  Options
	st store.Store
}

// create creates a volume of size bytes as the backend wants it.
func (s *suite) create(name string, size int64) (store.VolumeInfo, error) {
	var opts store.CreateOptions
	if s.o.Create != nil {
		size, opts = s.o.Create(s.t, name, size)
	}
	return s.st.CreateVolume(context.Background(), name, size, opts)
}

// mustCreate creates and opens a volume.
func (s *suite) mustCreate(name string, size int64) store.Volume {
	s.t.Helper()
	if _, err := s.create(name, size); err != nil {
		s.t.Fatalf("CreateVolume(%q): %v", name, err)
	}
	return s.mustOpen(name)
}

func (s *suite) mustOpen(name string) store.Volume {
	s.t.Helper()
	v, err := s.st.OpenVolume(context.Background(), name)
	if err != nil {
		s.t.Fatalf("OpenVolume(%q): %v", name, err)
	}
	return v
}

func (s *suite) stat(name string) store.VolumeInfo {
	s.t.Helper()
	info, err := s.st.StatVolume(context.Background(), name)
	if err != nil {
		s.t.Fatalf("StatVolume(%q): %v", name, err)
	}
	return info
}

// FillBlock fills b (one block) with a pattern derived from lba and tag:
// a 16-byte header (lba, tag) then xorshift bytes seeded by both, so a
// block read back can be checked against the block and version it claims.
func FillBlock(b []byte, lba, tag uint64) {
	binary.LittleEndian.PutUint64(b[0:8], lba)
	binary.LittleEndian.PutUint64(b[8:16], tag)
	x := lba*0x9e3779b97f4a7c15 ^ tag ^ 0x2545f4914f6cdd1d
	for i := 16; i < bs; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

// Pattern returns n blocks filled with FillBlock from lba on.
func Pattern(lba uint64, n int, tag uint64) []byte {
	b := make([]byte, n*bs)
	for i := range n {
		FillBlock(b[i*bs:(i+1)*bs], lba+uint64(i), tag)
	}
	return b
}

// BlockTag checks that b is a pattern block of lba and returns its tag; an
// all-zero block has tag 0 and ok true.
func BlockTag(b []byte, lba uint64) (tag uint64, ok bool) {
	if IsZero(b) {
		return 0, true
	}
	tag = binary.LittleEndian.Uint64(b[8:16])
	var want [bs]byte
	FillBlock(want[:], lba, tag)
	return tag, bytes.Equal(b, want[:])
}

// IsZero reports whether b is all zeros.
func IsZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func mustWrite(t testing.TB, v store.Volume, lba uint64, src []byte) {
	t.Helper()
	if err := v.WriteBlocks(context.Background(), lba, src, false); err != nil {
		t.Fatalf("WriteBlocks(%d, %d bytes): %v", lba, len(src), err)
	}
}

func mustRead(t testing.TB, v store.Volume, lba uint64, n int) []byte {
	t.Helper()
	dst := bytes.Repeat([]byte{0xa5}, n*bs) // stale garbage the read must overwrite
	if err := v.ReadBlocks(context.Background(), lba, dst); err != nil {
		t.Fatalf("ReadBlocks(%d, %d blocks): %v", lba, n, err)
	}
	return dst
}

// wantErr fails unless err is target.
func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

// equalBlocks fails with the first differing block.
func equalBlocks(t testing.TB, what string, lba uint64, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := 0; i < len(got); i += bs {
		if !bytes.Equal(got[i:i+bs], want[i:i+bs]) {
			gt, _ := BlockTag(got[i:i+bs], lba+uint64(i/bs))
			wt, _ := BlockTag(want[i:i+bs], lba+uint64(i/bs))
			t.Fatalf("%s: block %d differs (tag %d, want %d)", what, lba+uint64(i/bs), gt, wt)
		}
	}
}
