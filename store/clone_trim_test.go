package store

import (
	"context"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// TestCloneTrimPastOrigin: discarding the part of a grown clone that lies
// past its origin's end (mkfs discards a whole device) maps nothing there:
// those clusters read zeros already, so neither the clone's map in memory
// nor its metadata grows with the size discarded.
func TestCloneTrimPastOrigin(t *testing.T) {
	ctx := context.Background()
	be, err := openThinBackend(t.TempDir(), ThinOptions{ClusterSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	s := newVolumeStore(be)
	defer s.Close()
	const originSize, grown = 1 << 20, 1 << 30
	if _, err := s.CreateVolume(ctx, "o", originSize, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(ctx, "o", "s"); err != nil {
		t.Fatal(err)
	}
	info, err := s.Clone(ctx, "o", "s", "c", CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.GrowVolume(ctx, "c", grown); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Trim(ctx, 0, grown/BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var keys uint64
	err = be.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: idKey(tkMap, info.ID)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			keys++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if limit := be.clusters(originSize); keys > limit {
		t.Fatalf("the clone's map holds %d entries after the trim, its origin covers %d clusters", keys, limit)
	}
}
