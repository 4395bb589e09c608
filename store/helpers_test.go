package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"testing"
)

// childCommand returns a command running test function child of this test
// binary in a child process, with env=dir set in its environment. The
// child's body is a test that skips unless env is set.
func childCommand(child, env, dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+dir)
	return cmd
}

// fillBlock fills b (one block) with a pattern derived from lba and tag:
// a 16-byte header (lba, tag) then xorshift bytes seeded by both, so a
// block read back can be checked against the block and version it claims.
func fillBlock(b []byte, lba, tag uint64) {
	binary.LittleEndian.PutUint64(b[0:8], lba)
	binary.LittleEndian.PutUint64(b[8:16], tag)
	x := lba*0x9e3779b97f4a7c15 ^ tag ^ 0x2545f4914f6cdd1d
	for i := 16; i < BlockSize; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

// patternBlocks returns n blocks filled with fillBlock from lba on.
func patternBlocks(lba uint64, n int, tag uint64) []byte {
	b := make([]byte, n*BlockSize)
	for i := range n {
		fillBlock(b[i*BlockSize:(i+1)*BlockSize], lba+uint64(i), tag)
	}
	return b
}

// blockTag checks that b is a pattern block of lba and returns its tag; an
// all-zero block has tag 0 and ok true.
func blockTag(b []byte, lba uint64) (tag uint64, ok bool) {
	if isZero(b) {
		return 0, true
	}
	tag = binary.LittleEndian.Uint64(b[8:16])
	var want [BlockSize]byte
	fillBlock(want[:], lba, tag)
	return tag, bytes.Equal(b, want[:])
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// mustCreate creates and opens a volume.
func mustCreate(t testing.TB, s Store, name string, size int64) Volume {
	t.Helper()
	ctx := context.Background()
	if _, err := s.CreateVolume(ctx, name, size, CreateOptions{}); err != nil {
		t.Fatalf("CreateVolume(%q): %v", name, err)
	}
	v, err := s.OpenVolume(ctx, name)
	if err != nil {
		t.Fatalf("OpenVolume(%q): %v", name, err)
	}
	return v
}

func mustWrite(t testing.TB, v Volume, lba uint64, src []byte) {
	t.Helper()
	if err := v.WriteBlocks(context.Background(), lba, src, false); err != nil {
		t.Fatalf("WriteBlocks(%d, %d bytes): %v", lba, len(src), err)
	}
}

func mustRead(t testing.TB, v Volume, lba uint64, n int) []byte {
	t.Helper()
	dst := make([]byte, n*BlockSize)
	for i := range dst {
		dst[i] = 0xa5 // stale garbage the read must overwrite
	}
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
	for i := 0; i < len(got); i += BlockSize {
		if !bytes.Equal(got[i:i+BlockSize], want[i:i+BlockSize]) {
			gt, _ := blockTag(got[i:i+BlockSize], lba+uint64(i/BlockSize))
			wt, _ := blockTag(want[i:i+BlockSize], lba+uint64(i/BlockSize))
			t.Fatalf("%s: block %d differs (tag %d, want %d)", what, lba+uint64(i/BlockSize), gt, wt)
		}
	}
}
