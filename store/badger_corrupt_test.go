package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// TestBadgerChecksum corrupts stored values through badger: reads of the
// bad block fail with ErrChecksum and return zeros, never the data.
func TestBadgerChecksum(t *testing.T) {
	ctx := context.Background()
	s := newBadgerForTest(t)
	defer s.Close()
	v := mustCreate(t, s, "c", 64*BlockSize)
	defer v.Close()
	data := patternBlocks(0, 64, 9)
	mustWrite(t, v, 0, data)
	db := badgerOf(s).db
	id := v.Info().ID

	corrupt := func(lba uint64, change func([]byte) []byte) {
		t.Helper()
		key := newBlockKey(id, lba)
		err := db.Update(func(txn *badger.Txn) error {
			item, err := txn.Get(key)
			if err != nil {
				return err
			}
			val, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			return txn.Set(key, change(val))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	flip := func(off int) func([]byte) []byte {
		return func(b []byte) []byte { b[off] ^= 0x40; return b }
	}
	cases := []struct {
		name   string
		lba    uint64
		change func([]byte) []byte
	}{
		{"data byte", 10, flip(4 + 1000)},
		{"last data byte", 11, flip(blockValueLen - 1)},
		{"crc byte", 12, flip(0)},
		{"truncated", 13, func(b []byte) []byte { return b[:blockValueLen-1] }},
		{"extended", 14, func(b []byte) []byte { return append(b, 0) }},
		{"empty", 15, func([]byte) []byte { return nil }},
	}
	for _, c := range cases {
		corrupt(c.lba, c.change)
		for _, r := range [][2]uint64{{c.lba, 1}, {c.lba - 5, 8}, {0, 64}} {
			buf := bytes.Repeat([]byte{0xee}, int(r[1])*BlockSize)
			err := v.ReadBlocks(ctx, r[0], buf)
			wantErr(t, c.name, err, ErrChecksum)
			var oe *OpError
			if !errors.As(err, &oe) || oe.Volume != "c" || oe.LBA != r[0] {
				t.Fatalf("%s: error %v lacks context", c.name, err)
			}
			if !isZero(buf) {
				t.Fatalf("%s: failed read of %v left data in the buffer", c.name, r)
			}
		}
		// Rewriting the block heals it.
		mustWrite(t, v, c.lba, data[c.lba*BlockSize:(c.lba+1)*BlockSize])
	}
	equalBlocks(t, "healed", 0, mustRead(t, v, 0, 64), data)
}

// TestBadgerCorruptValueLog flips a byte of a block inside a value log file
// on disk. In a sealed file the read of that block fails with ErrChecksum
// (our CRC catches it; badger does not check its own on reads). In the
// active file badger's recovery truncates the log at the bad entry when it
// opens, losing the entries after it: those reads must fail too, never
// return other data.
func TestBadgerCorruptValueLog(t *testing.T) {
	for _, sealed := range []bool{true, false} {
		name := map[bool]string{true: "sealed", false: "active"}[sealed]
		t.Run(name, func(t *testing.T) { testCorruptValueLog(t, sealed) })
	}
}

func testCorruptValueLog(t *testing.T, sealed bool) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := BadgerOptions{ValueLogFileSize: 1 << 20}
	s := openBadger(t, dir, opts)
	v := mustCreate(t, s, "c", 1024*BlockSize)
	data := patternBlocks(0, 16, 77)
	mustWrite(t, v, 0, data)
	if sealed { // fill the first value log file and then some
		for lba := uint64(16); lba < 16+3*256; lba += 64 {
			mustWrite(t, v, lba, patternBlocks(lba, 64, 78))
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	target := data[7*BlockSize+100 : 7*BlockSize+164] // unique bytes of block 7
	vlogs, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	found := ""
	for _, path := range vlogs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, target); i >= 0 {
			b[i+10] ^= 1
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			found = path
		}
	}
	if found == "" {
		t.Fatal("block data not found in any value log file")
	}
	t.Logf("corrupted %s of %d value log files", filepath.Base(found), len(vlogs))

	s = openBadger(t, dir, opts)
	defer s.Close()
	v, err := s.OpenVolume(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for lba := range uint64(16) {
		buf := bytes.Repeat([]byte{0xee}, BlockSize)
		err := v.ReadBlocks(ctx, lba, buf)
		switch {
		case err == nil:
			equalBlocks(t, "readable block", lba, buf, data[lba*BlockSize:(lba+1)*BlockSize])
		case errors.Is(err, ErrChecksum):
			lost++
			if !isZero(buf) {
				t.Fatalf("failed read of block %d left data in the buffer", lba)
			}
		default:
			t.Fatalf("block %d: unexpected error %v", lba, err)
		}
		if lba == 7 && err == nil {
			t.Fatal("read of the block corrupted on disk succeeded")
		}
	}
	t.Logf("%d of 16 blocks unreadable", lost)
	if sealed && lost != 1 {
		t.Fatalf("%d blocks unreadable, want only the corrupted one", lost)
	}
}
