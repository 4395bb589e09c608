package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/rnic-dev/rnic/rnic/crc32c"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

// writeV1 makes a v1 store in dir (the layout of the per-block badger
// store): volumes with the given sizes and blocks.
func writeV1(t *testing.T, dir string, vols map[string]int64, blocks map[string]map[uint64][]byte, corrupt string) {
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	id := uint32(0)
	err = db.Update(func(txn *badger.Txn) error {
		if err := txn.Set([]byte{0x00}, []byte("rnic-store v1")); err != nil {
			return err
		}
		for name, size := range vols {
			id++
			rec, _ := json.Marshal(map[string]any{"v": 1, "name": name, "id": id, "size": size,
				"created": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "meta": map[string]string{"owner": "o-" + name}})
			if err := txn.Set(append([]byte{0x02}, name...), rec); err != nil {
				return err
			}
			for lba, data := range blocks[name] {
				k := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32([]byte{0x10}, id), lba)
				v := binary.BigEndian.AppendUint32(nil, crc32c.Update(0, data))
				v = append(v, data...)
				if name == corrupt {
					v[100] ^= 1
				}
				if err := txn.Set(k, v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMigrateV1(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	vols := map[string]int64{"plain": 1 << 20, "a@b/c": 64 << 10}
	blocks := map[string]map[uint64][]byte{
		"plain": {0: storetest.Pattern(0, 1, 1), 1: storetest.Pattern(1, 1, 1), 200: storetest.Pattern(200, 1, 2)},
		"a@b/c": {15: storetest.Pattern(15, 1, 3)},
	}
	writeV1(t, dir, vols, blocks, "")
	if _, err := store.OpenThin(dir, store.ThinOptions{}); !errors.Is(err, store.ErrV1Store) {
		t.Fatalf("OpenThin on a v1 store: %v, want ErrV1Store", err)
	}
	// A leftover of an earlier attempt that did not complete is redone.
	os.MkdirAll(filepath.Join(dir, "migrate.tmp", "junk"), 0o755)
	rep, err := store.MigrateV1(ctx, dir, store.ThinOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Volumes) != 2 {
		t.Fatalf("report %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(rep.Backup, "MANIFEST")); err != nil {
		t.Fatalf("the v1 files are not kept: %v", err)
	}
	s, err := store.OpenThin(dir, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for old, size := range vols {
		name := old
		if old == "a@b/c" {
			name = "a_b_c"
		}
		info, err := s.StatVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != size || info.Meta["owner"] != "o-"+old || info.Meta["v1-created"] == "" {
			t.Fatalf("migrated %s: %+v", name, info)
		}
		v, err := s.OpenVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if err := v.ReadBlocks(ctx, 0, got); err != nil {
			t.Fatal(err)
		}
		v.Close()
		want := make([]byte, size)
		for lba, b := range blocks[old] {
			copy(want[lba*store.BlockSize:], b)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("volume %s differs after migration", name)
		}
	}
}

func TestMigrateV1StopsAtABadBlock(t *testing.T) {
	dir := t.TempDir()
	writeV1(t, dir, map[string]int64{"v": 1 << 20}, map[string]map[uint64][]byte{"v": {3: storetest.Pattern(3, 1, 1)}}, "v")
	_, err := store.MigrateV1(context.Background(), dir, store.ThinOptions{}, nil)
	if !errors.Is(err, store.ErrChecksum) {
		t.Fatalf("migration over a corrupt block: %v, want ErrChecksum", err)
	}
	if _, err := store.OpenThin(dir, store.ThinOptions{}); !errors.Is(err, store.ErrV1Store) {
		t.Fatalf("OpenThin after a failed migration: %v, want ErrV1Store", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "migrate.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed migration left its thin store: %v", err)
	}
}
