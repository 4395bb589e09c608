package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// TestOpenRefusesBadFreeRanges: free ranges in the database that this
// store never writes, overlapping or over the header, make the open fail
// with ErrCorrupt: handed out, their clusters could hold two volumes' data
// at once, or the header. Ranges that only touch are merged, and stored
// merged.
func TestOpenRefusesBadFreeRanges(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		ranges [][2]uint64 // clusters past the first data cluster
		header bool        // a range over the header clusters instead
		opens  bool        // the open succeeds
	}{
		{name: "overlapping", ranges: [][2]uint64{{2, 6}, {4, 8}}},
		{name: "touching", ranges: [][2]uint64{{0, 4}, {4, 20}, {20, 32}}, opens: true},
		{name: "header", header: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenThin(dir, ThinOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.CreateVolume(ctx, "v", 4<<20, CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			v, err := s.OpenVolume(ctx, "v")
			if err != nil {
				t.Fatal(err)
			}
			// 2 MiB: 32 clusters of 64 KiB from the first data cluster,
			// then free again: the database holds one free range of 32.
			if err := v.WriteBlocks(ctx, 0, make([]byte, 2<<20), true); err != nil {
				t.Fatal(err)
			}
			if err := v.Trim(ctx, 0, (2<<20)/BlockSize); err != nil {
				t.Fatal(err)
			}
			v.Close()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			first := uint64(dataStart / DefaultClusterSize)

			db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, thinMetaDir)).WithLogger(nil))
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(txn *badger.Txn) error {
				ranges := tc.ranges
				if tc.header {
					ranges = [][2]uint64{{0, 2}}
					first = 1 // [1, 3): cluster 0 is refused already
				}
				if err := txn.Delete(freeKey(uint64(dataStart / DefaultClusterSize))); err != nil {
					return err
				}
				for _, r := range ranges {
					if err := txn.Set(freeKey(first+r[0]), binary.BigEndian.AppendUint64(nil, first+r[1])); err != nil {
						return err
					}
				}
				return nil
			})
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}

			s, err = OpenThin(dir, ThinOptions{})
			if tc.opens {
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				want := []clusterRange{{first, first + 32}}
				b := s.(*volumeStore).be.(*thinBackend)
				if got := b.durable.r; fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("free ranges %v, want %v", got, want)
				}
				// Stored merged: the database and the memory agree.
				if err := b.check(ctx); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("open with free ranges %v from %d: no error", tc.ranges, first)
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "free range") {
				t.Fatalf("open: %v, want ErrCorrupt naming the free range", err)
			}
			t.Log(err)
		})
	}
}
