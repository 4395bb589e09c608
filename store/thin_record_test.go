package store

import (
	"reflect"
	"testing"
	"time"
)

// fullRecord returns a record with every field set, some snapshots being
// deleted, and times as the store makes them (UTC, no monotonic reading).
func fullRecord(snaps int) *thinRecord {
	created := time.Date(2026, 11, 26, 15, 4, 5, 123456789, time.UTC)
	r := &thinRecord{Name: "vol", ID: 7, Kind: KindThin, Size: 1 << 30, Created: created,
		Meta: map[string]string{"owner": "ci"}, Origin: &thinOrigin{ID: 3, Epoch: 9, Size: 1 << 29},
		Epoch: uint32(snaps + 1), Rollback: &thinRollback{Epoch: 2, Next: 12345}}
	for i := range snaps {
		r.Snapshots = append(r.Snapshots, thinSnap{Name: "s" + string(rune('a'+i%26)), Epoch: uint32(i + 1),
			Created: time.Now().UTC(), Size: int64(i+1) << 20, Deleting: i%5 == 0})
	}
	return r
}

// TestThinRecordRoundTrip: decoding an encoded record gives it back, the
// property that lets putRecord cache the record it writes in place of
// the one a decode of its bytes would make.
func TestThinRecordRoundTrip(t *testing.T) {
	for _, r := range []*thinRecord{
		fullRecord(100),
		{Name: "bare", ID: 1, Kind: KindRaw, Size: 4096, Created: time.Now().UTC(), Epoch: 1, RawPath: "/dev/x"},
	} {
		b, err := encodeThinRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeThinRecord(r.Name, b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("decoded record differs from the one encoded:\n got %+v\nwant %+v", got, r)
		}
	}
}

// TestRecordCache: a lookup hits only with the bytes the record was
// cached with; what it returns is a copy the caller may change; records
// below the size bound are not kept.
func TestRecordCache(t *testing.T) {
	var c recordCache
	r := fullRecord(100)
	raw, err := encodeThinRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < recordCacheMin {
		t.Fatalf("a record of 100 snapshots takes %d bytes, under the cache's bound %d", len(raw), recordCacheMin)
	}
	c.put("vol", raw, r)
	r.Snapshots[0].Name = "changed by the caller after put"
	want, _ := decodeThinRecord("vol", raw)
	got := c.get("vol", raw)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cached record differs from its bytes' decoding:\n got %+v\nwant %+v", got, want)
	}
	got.Meta["owner"], got.Origin.ID, got.Rollback.Next = "x", 99, 1
	got.Snapshots[1].Deleting = !got.Snapshots[1].Deleting
	if again := c.get("vol", raw); !reflect.DeepEqual(again, want) {
		t.Fatal("changing a record the cache returned changed the cache")
	}
	changed := append([]byte(nil), raw...)
	changed[len(changed)/2] ^= 1
	if c.get("vol", changed) != nil || c.get("other", raw) != nil {
		t.Fatal("a lookup with other bytes or another name hit")
	}
	small, _ := encodeThinRecord(fullRecord(1))
	c.put("vol", small, fullRecord(1))
	if c.get("vol", small) != nil || c.get("vol", raw) != nil {
		t.Fatal("a small record was cached, or its put left the large one")
	}
}
