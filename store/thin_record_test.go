package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// fullRecord returns a record with every field set, some snapshots being
// deleted, and times as the store makes them (UTC, no monotonic reading).
func fullRecord(snaps int) *thinRecord {
	created := time.Date(2026, 11, 26, 15, 4, 5, 123456789, time.UTC)
	r := &thinRecord{Name: "vol", ID: 7, Kind: KindThin, Size: 1 << 30, Created: created,
		Meta: map[string]string{"owner": "ci"}, Origin: &thinOrigin{ID: 3, Epoch: 9, Size: 1 << 29},
		Epoch: uint32(snaps + 1), SnapTag: newSnapTag(), Rollback: &thinRollback{Epoch: 2, Next: 12345}}
	for i := range snaps {
		r.Snapshots = append(r.Snapshots, thinSnap{Name: "s" + string(rune('a'+i%26)), Epoch: uint32(i + 1),
			Created: time.Now().UTC(), Size: int64(i+1) << 20, Deleting: i%5 == 0})
	}
	return r
}

// TestThinRecordRoundTrip: decoding an encoded record gives it back
// without its snapshots, and decoding each encoded snapshot gives it
// back: the property that lets putRecord cache the record it writes in
// place of the one a lookup would load. A record is small whatever its
// snapshot count.
func TestThinRecordRoundTrip(t *testing.T) {
	for _, r := range []*thinRecord{
		fullRecord(100),
		{Name: "bare", ID: 1, Kind: KindRaw, Size: 4096, Created: time.Now().UTC(), Epoch: 1, RawPath: "/dev/x"},
	} {
		b, err := encodeThinRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 512 {
			t.Fatalf("record of %d snapshots stored in %d bytes", len(r.Snapshots), len(b))
		}
		got, err := decodeThinRecord(r.Name, b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range r.Snapshots {
			v, err := encodeSnap(&r.Snapshots[i])
			if err != nil {
				t.Fatal(err)
			}
			s, err := decodeSnap(r.Name, r.Snapshots[i].Epoch, v)
			if err != nil {
				t.Fatal(err)
			}
			got.Snapshots = append(got.Snapshots, s)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("decoded record differs from the one encoded:\n got %+v\nwant %+v", got, r)
		}
	}
	v, _ := encodeSnap(&thinSnap{Name: "x", Epoch: 4})
	if _, err := decodeSnap("vol", 5, v); err == nil {
		t.Fatal("a snapshot stored under another epoch's key decoded")
	}
	withSnaps, _ := json.Marshal(&thinRecord{Version: thinRecordVersion, Name: "v", ID: 1, Kind: KindThin, Size: 4096,
		Epoch: 2, Snapshots: []thinSnap{{Name: "s", Epoch: 1}}})
	if _, err := decodeThinRecord("v", withSnaps); err == nil {
		t.Fatal("a record of version 2 holding snapshots decoded")
	}
}

// TestRecordCache: a lookup hits only with the bytes the record was
// cached with; what it returns is a copy the caller may change; a
// disabled cache keeps nothing.
func TestRecordCache(t *testing.T) {
	var c recordCache
	r := fullRecord(100)
	raw, err := encodeThinRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	want := fullRecord(100)
	want.Snapshots = append(want.Snapshots[:0:0], r.Snapshots...)
	want.Version, want.SnapTag = r.Version, r.SnapTag
	c.put("vol", raw, r)
	r.Snapshots[0].Name = "changed by the caller after put"
	got := c.get("vol", raw, true)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cached record differs from the one put:\n got %+v\nwant %+v", got, want)
	}
	got.Meta["owner"], got.Origin.ID, got.Rollback.Next = "x", 99, 1
	got.Snapshots[1].Deleting = !got.Snapshots[1].Deleting
	if again := c.get("vol", raw, true); !reflect.DeepEqual(again, want) {
		t.Fatal("changing a record the cache returned changed the cache")
	}
	changed := append([]byte(nil), raw...)
	changed[len(changed)/2] ^= 1
	if c.get("vol", changed, true) != nil || c.get("other", raw, true) != nil {
		t.Fatal("a lookup with other bytes or another name hit")
	}
	off := recordCache{off: true}
	off.put("vol", raw, r)
	if off.get("vol", raw, true) != nil {
		t.Fatal("a disabled cache kept a record")
	}
}

// TestThinFormat1Migration: a store of format 1 (snapshots inside the
// volume records) opens as format 2 with the same volumes, snapshots and
// data, also when an earlier migration stopped half way (snapshot keys of
// a volume written, its record still of version 1, and a key for a
// snapshot the record no longer lists).
func TestThinFormat1Migration(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := ThinOptions{ClusterSize: 16 << 10}
	s, err := OpenThin(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	if _, err := s.CreateVolume(ctx, "a", size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		buf := bytes.Repeat([]byte{byte(i + 1)}, 64<<10)
		if err := v.WriteBlocks(ctx, uint64(i*16), buf, false); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateSnapshot(ctx, "a", fmt.Sprintf("s%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "a", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Clone(ctx, "a", "s3", "c", CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(ctx, "c", "cs"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, "plain", size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := storeContents(t, s)
	b := s.(*volumeStore).be.(*thinBackend)

	// Back to format 1: every record of version 1 with its snapshots, no
	// snapshot keys. For volume a, a migration half done: its snapshot
	// keys, and one of a snapshot deleted since.
	var aID uint32
	err = b.db.Update(func(txn *badger.Txn) error {
		recs, err := b.records(txn)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			if rec.Name == "a" {
				aID = rec.ID
			}
			rec.Version, rec.SnapTag = thinRecordVersionV1, 0
			v1, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			if err := txn.Set(thinVolumeKey(rec.Name), v1); err != nil {
				return err
			}
		}
		var keys [][]byte
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tkSnap}})
		for it.Rewind(); it.Valid(); it.Next() {
			if id := it.Item().Key()[1:5]; !bytes.Equal(id, idKey(tkSnap, aID)[1:]) {
				keys = append(keys, it.Item().KeyCopy(nil))
			}
		}
		it.Close()
		if err := deleteKeys(txn, keys); err != nil {
			return err
		}
		stale, _ := encodeSnap(&thinSnap{Name: "s1", Epoch: 2})
		if err := txn.Set(snapKey(aID, 2), stale); err != nil {
			return err
		}
		f, _ := json.Marshal(thinFormat{Format: thinFormatName, Version: 1, ClusterSize: b.cs, UUID: b.uuidForTest(t)})
		return txn.Set(thinFormatKey, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenThin(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	CheckThin(t, s)
	if after := storeContents(t, s); after != before {
		t.Fatalf("after the migration:\n%s\nbefore:\n%s", after, before)
	}
	b = s.(*volumeStore).be.(*thinBackend)
	err = b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(thinFormatKey)
		if err != nil {
			return err
		}
		var f thinFormat
		if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &f) }); err != nil {
			return err
		}
		if f.Version != thinFormatVersion {
			return fmt.Errorf("format %d after the migration", f.Version)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// And it goes on as format 2: a snapshot more, a reopen.
	if _, err := s.CreateSnapshot(ctx, "a", "s5"); err != nil {
		t.Fatal(err)
	}
	CheckThin(t, s)
}

// uuidForTest returns the store's UUID from its format record.
func (b *thinBackend) uuidForTest(t *testing.T) string {
	var f thinFormat
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(thinFormatKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return json.Unmarshal(v, &f) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return f.UUID
}

// storeContents describes every volume and snapshot of s: names, sizes,
// origins, and a digest of the data.
func storeContents(t *testing.T, s Store) string {
	t.Helper()
	ctx := context.Background()
	infos, err := s.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	read := func(name string, size int64) {
		v, err := s.OpenVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		buf := make([]byte, size)
		if err := v.ReadBlocks(ctx, 0, buf); err != nil {
			t.Fatal(err)
		}
		var sum [8]byte
		for i, c := range buf {
			sum[i%8] ^= c + byte(i/4096)
		}
		fmt.Fprintf(&out, "%s size %d data %x\n", name, size, sum)
	}
	for _, info := range infos {
		fmt.Fprintf(&out, "volume %s origin %q:", info.Name, info.Origin)
		for _, sn := range info.Snapshots {
			fmt.Fprintf(&out, " %s(%s)", sn.Name, sn.Created.Format(time.RFC3339Nano))
		}
		out.WriteByte('\n')
		read(info.Name, info.Size)
		for _, sn := range info.Snapshots {
			read(info.Name+"@"+sn.Name, sn.Size)
		}
	}
	return out.String()
}
