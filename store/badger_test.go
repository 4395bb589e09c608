package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// newBadgerForTest opens a badger store in a fresh temporary directory.
func newBadgerForTest(t *testing.T) Store {
	t.Helper()
	s, err := OpenBadger(t.TempDir(), BadgerOptions{})
	if err != nil {
		t.Fatalf("OpenBadger: %v", err)
	}
	return s
}

// badgerOf returns the badger backend behind a Store from OpenBadger.
func badgerOf(s Store) *badgerBackend { return s.(*volumeStore).be.(*badgerBackend) }

// countKeys counts the keys starting with prefix.
func countKeys(t *testing.T, db *badger.DB, prefix []byte) int {
	t.Helper()
	n := 0
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func openBadger(t *testing.T, dir string, opts BadgerOptions) Store {
	t.Helper()
	s, err := OpenBadger(dir, opts)
	if err != nil {
		t.Fatalf("OpenBadger(%s): %v", dir, err)
	}
	return s
}

func TestBadgerReopenKeepsVolumes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openBadger(t, dir, BadgerOptions{})
	info, err := s.CreateVolume(ctx, "keep", 256*BlockSize, CreateOptions{Meta: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.OpenVolume(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	data := patternBlocks(0, 256, 5)
	mustWrite(t, v, 0, data)
	if err := v.Trim(ctx, 100, 10); err != nil {
		t.Fatal(err)
	}
	clear(data[100*BlockSize : 110*BlockSize])
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for round := range 2 {
		s = openBadger(t, dir, BadgerOptions{})
		_, err = s.CreateVolume(ctx, "keep", 8*BlockSize, CreateOptions{})
		wantErr(t, "CreateVolume of an existing volume after reopen", err, ErrExists)
		v, err = s.OpenVolume(ctx, "keep")
		if err != nil {
			t.Fatal(err)
		}
		got := v.Info()
		if got.ID != info.ID || got.Size != info.Size || !got.Created.Equal(info.Created) || got.Meta["k"] != "v" {
			t.Fatalf("round %d: reopened info %+v, created %+v", round, got, info)
		}
		equalBlocks(t, "data after reopen", 0, mustRead(t, v, 0, 256), data)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// The id counter survives too: ids are never reused.
	s = openBadger(t, dir, BadgerOptions{})
	defer s.Close()
	if err := s.DeleteVolume(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	other, err := s.CreateVolume(ctx, "other", BlockSize, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if other.ID <= info.ID {
		t.Fatalf("new volume id %d not above old id %d", other.ID, info.ID)
	}
}

func TestBadgerDirLock(t *testing.T) {
	dir := t.TempDir()
	s := openBadger(t, dir, BadgerOptions{})
	_, err := OpenBadger(dir, BadgerOptions{})
	wantErr(t, "second OpenBadger of a directory", err, ErrLocked)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openBadger(t, dir, BadgerOptions{}) // the lock is released on Close
	s.Close()
}

func TestBadgerRefusesForeignDatabase(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("someone"), []byte("else")) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = OpenBadger(dir, BadgerOptions{})
	wantErr(t, "OpenBadger of a foreign database", err, ErrCorrupt)
}

func TestBadgerInvalidOptions(t *testing.T) {
	for _, o := range []BadgerOptions{
		{MemTableSize: 1 << 20},
		{ValueLogFileSize: 1 << 10},
		{GCDiscardRatio: 1.5},
		{NumMemtables: -1},
		{BlockCacheSize: -1},
	} {
		_, err := OpenBadger(t.TempDir(), o)
		wantErr(t, "OpenBadger with bad options", err, ErrInvalid)
	}
}

// TestBadgerTxnLimits checks that the smallest allowed memtable still lets
// a MaxAtomicWrite go in one transaction.
func TestBadgerTxnLimits(t *testing.T) {
	s := openBadger(t, t.TempDir(), BadgerOptions{MemTableSize: minMemTableSize})
	defer s.Close()
	b := badgerOf(s)
	if b.txnBlocks*BlockSize < MaxAtomicWrite {
		t.Fatalf("transaction takes %d blocks, below MaxAtomicWrite", b.txnBlocks)
	}
	// And badger agrees: a transaction of txnBlocks blocks commits.
	v := mustCreate(t, s, "big", int64(b.txnBlocks)*BlockSize)
	defer v.Close()
	mustWrite(t, v, 0, make([]byte, b.txnBlocks*BlockSize))
	if b.txnDeletes < 1000 {
		t.Fatalf("only %d deletes per transaction", b.txnDeletes)
	}
}

// TestBadgerTrimDeletesKeys checks that trim and write-zeroes delete keys
// (only those present), in transactions of bounded size.
func TestBadgerTrimDeletesKeys(t *testing.T) {
	ctx := context.Background()
	s := newBadgerForTest(t)
	defer s.Close()
	b := badgerOf(s)
	b.txnDeletes = 7 // force many small delete transactions
	v := mustCreate(t, s, "t", 1<<30)
	defer v.Close()
	id := v.Info().ID
	prefix := volumeBlocksPrefix(id)
	mustWrite(t, v, 0, patternBlocks(0, 100, 1))
	mustWrite(t, v, 1000, patternBlocks(1000, 50, 1))
	if n := countKeys(t, b.db, prefix); n != 150 {
		t.Fatalf("%d keys after writing 150 blocks", n)
	}
	if err := v.Trim(ctx, 10, 20); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, b.db, prefix); n != 130 {
		t.Fatalf("%d keys after trimming 20, want 130", n)
	}
	// A huge sparse range: only the present keys are visited.
	if err := v.WriteZeroes(ctx, 50, v.Info().Blocks()-50, true); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, b.db, prefix); n != 30 {
		t.Fatalf("%d keys after write-zeroes, want 30", n)
	}
	got := mustRead(t, v, 0, 100)
	equalBlocks(t, "kept blocks", 0, got[:10*BlockSize], patternBlocks(0, 10, 1))
	equalBlocks(t, "kept blocks", 30, got[30*BlockSize:50*BlockSize], patternBlocks(30, 20, 1))
	if !isZero(got[10*BlockSize:30*BlockSize]) || !isZero(got[50*BlockSize:]) {
		t.Fatal("discarded blocks are not zero")
	}
}

// TestBadgerSplitWrite forces a write larger than a transaction: it is
// split, and every block lands.
func TestBadgerSplitWrite(t *testing.T) {
	s := newBadgerForTest(t)
	defer s.Close()
	badgerOf(s).txnBlocks = 3
	v := mustCreate(t, s, "w", 64*BlockSize)
	defer v.Close()
	data := patternBlocks(2, 50, 4)
	mustWrite(t, v, 2, data)
	equalBlocks(t, "split write", 2, mustRead(t, v, 2, 50), data)
}

func TestBadgerDeleteReapsBlocks(t *testing.T) {
	ctx := context.Background()
	s := newBadgerForTest(t)
	defer s.Close()
	b := badgerOf(s)
	b.txnDeletes = 64
	v := mustCreate(t, s, "d", 1024*BlockSize)
	id := v.Info().ID
	mustWrite(t, v, 0, patternBlocks(0, 1000, 1))
	v.Close()
	if err := s.DeleteVolume(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, b.db, volumeBlocksPrefix(id)); n != 0 {
		t.Fatalf("%d blocks left after DeleteVolume", n)
	}
	if n := countKeys(t, b.db, deletedKey(id)); n != 0 {
		t.Fatal("deletion marker left behind")
	}
}

// TestBadgerReapAfterCrash leaves a volume half-deleted (record gone,
// blocks and marker present), as a crash inside DeleteVolume would; the
// reopened store reaps the blocks in the background.
func TestBadgerReapAfterCrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openBadger(t, dir, BadgerOptions{})
	v := mustCreate(t, s, "d", 512*BlockSize)
	id := v.Info().ID
	mustWrite(t, v, 0, patternBlocks(0, 512, 1))
	v.Close()
	err := badgerOf(s).db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(volumeKey("d")); err != nil {
			return err
		}
		return txn.Set(deletedKey(id), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openBadger(t, dir, BadgerOptions{})
	defer s.Close()
	b := badgerOf(s)
	if _, err := s.OpenVolume(ctx, "d"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("half-deleted volume opens: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for countKeys(t, b.db, deletedKey(id)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("deleted volume not reaped after reopen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := countKeys(t, b.db, volumeBlocksPrefix(id)); n != 0 {
		t.Fatalf("%d blocks left after reaping", n)
	}
}

// TestBadgerFlushSyncs checks that Flush, FUA writes, FUA write-zeroes and
// Sync each complete a database sync that started after they were called.
func TestBadgerFlushSyncs(t *testing.T) {
	ctx := context.Background()
	s := newBadgerForTest(t)
	defer s.Close()
	b := badgerOf(s)
	v := mustCreate(t, s, "f", 16*BlockSize)
	defer v.Close()
	buf := make([]byte, BlockSize)
	for _, c := range []struct {
		name string
		op   func() error
		sync bool
	}{
		{"write", func() error { return v.WriteBlocks(ctx, 0, buf, false) }, false},
		{"fua write", func() error { return v.WriteBlocks(ctx, 0, buf, true) }, true},
		{"flush", func() error { return v.Flush(ctx) }, true},
		{"trim", func() error { return v.Trim(ctx, 0, 1) }, false},
		{"fua write-zeroes", func() error { return v.WriteZeroes(ctx, 0, 1, true) }, true},
		{"store sync", func() error { return s.Sync(ctx) }, true},
	} {
		before := b.syncs.Load()
		if err := c.op(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if synced := b.syncs.Load() > before; synced != c.sync {
			t.Fatalf("%s: synced %v, want %v", c.name, synced, c.sync)
		}
	}
}
