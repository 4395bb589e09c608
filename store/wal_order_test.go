package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/rnic-dev/rnic/internal/loopfs"
)

// walOrderChildEnv names the mount point of TestWALOrderPowerCut's child;
// with walOrderWritebackEnv set too, the child cuts the power where
// TestWALWritebackPowerCut says.
const (
	walOrderChildEnv     = "STORE_WAL_ORDER_CHILD_MNT"
	walOrderWritebackEnv = "STORE_WAL_ORDER_WRITEBACK"
)

// newestWAL returns the number of the newest memtable WAL (NNNNN.mem) in
// the badger directory dir, -1 if there is none.
func newestWAL(t *testing.T, dir string) int {
	t.Helper()
	newest := -1
	for n := range walFids(t, dir) {
		newest = max(newest, n)
	}
	return newest
}

// openChunked makes the commit transactions of thin store st take chunk
// batch ops each, and creates and opens volume v (64 MiB) in it.
func openChunked(t *testing.T, st Store, chunk int) (*thinBackend, Volume) {
	t.Helper()
	b := st.(*volumeStore).be.(*thinBackend)
	b.metaMu.Lock()
	b.commitChunk = chunk
	b.metaMu.Unlock()
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "v", 64<<20, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := st.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	return b, v
}

// TestWALOrderPowerCutChild: the child of TestWALOrderPowerCut. Block 0 of
// volume v holds X (written with FUA), then snapshot s is taken. The
// metadata's memtable is filled (volume attributes) to within one such
// change of full. One commit then writes, in a first transaction, the copy
// on write of cluster 0 (X goes to s's delta) and 255 new clusters, which
// fill the memtable, and in a second, which therefore starts a new memtable
// and WAL, the trim of cluster 0. The power is cut as soon as the commit's
// metadata sync has made the newest WAL durable.
func TestWALOrderPowerCutChild(t *testing.T) {
	mnt := os.Getenv(walOrderChildEnv)
	if mnt == "" {
		t.Skip("runs only as the child process of TestWALOrderPowerCut")
	}
	dir := filepath.Join(mnt, "store")
	st, err := OpenThin(dir, ThinOptions{ClusterSize: BlockSize, MemTableSize: minMemTableSize, CommitInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	b, v := openChunked(t, st, 256)
	ctx := context.Background()
	if err := v.WriteBlocks(ctx, 0, bytes.Repeat([]byte{'X'}, BlockSize), true); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateSnapshot(ctx, "v", "s"); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(dir, thinMetaDir)
	attrs := map[string]string{"k": strings.Repeat("m", 6<<10)}
	// untilNewWAL changes the attributes until a change starts a new
	// memtable; it returns how many changes that took.
	untilNewWAL := func() int {
		start, n := newestWAL(t, meta), 0
		for newestWAL(t, meta) == start {
			if err := st.SetMeta(ctx, "v", attrs); err != nil {
				t.Fatal(err)
			}
			n++
		}
		return n
	}
	untilNewWAL()
	// The memtable just begun holds one change; k fill one.
	k := untilNewWAL()
	for range k - 2 {
		if err := st.SetMeta(ctx, "v", attrs); err != nil {
			t.Fatal(err)
		}
	}
	before := newestWAL(t, meta)
	if err := v.WriteBlocks(ctx, 0, bytes.Repeat([]byte{'Y'}, BlockSize), false); err != nil {
		t.Fatal(err)
	}
	for c := uint64(1); c < 256; c++ {
		if err := v.WriteBlocks(ctx, c, bytes.Repeat([]byte{'F'}, BlockSize), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.Trim(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	cut := func() {
		if newestWAL(t, meta) == before {
			t.Error("the commit's transactions all went to one memtable: nothing tested")
			return
		}
		if err := (&loopfs.FS{Dir: mnt}).PowerCut(); err != nil {
			t.Error(err)
			return
		}
		CrashNow()
	}
	if os.Getenv(walOrderWritebackEnv) != "" {
		// The kernel writes back the newest WAL's pages (badger's WALs
		// are mapped, and written back whenever the kernel likes) before
		// the commit's metadata sync begins: the power is cut then.
		hook := func() error {
			path := filepath.Join(meta, fmt.Sprintf("%05d.mem", newestWAL(t, meta)))
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Error(err)
				return err
			}
			err = f.Sync()
			f.Close()
			if err != nil {
				t.Error(err)
				return err
			}
			cut()
			return nil
		}
		b.syncMetaHook.Store(&hook)
	} else {
		b.walSyncedHook.Store(&cut)
	}
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	t.Fatal("the flush returned: no power cut")
}

// TestWALOrderPowerCut: a commit whose transactions span two memtables
// (and so two WALs) is cut by a power failure once its newest WAL is
// durable. What survives must be a prefix of the commit: the snapshot
// taken before it still reads X, and the metadata checks out. Were the
// newest WAL made durable before the older one, the trim would survive
// without the copy on write before it: the head's entry newer than the
// snapshot with no delta entry keeping X, whose cluster the open then
// frees as lost, and the snapshot reading zeros.
func TestWALOrderPowerCut(t *testing.T) {
	walOrderPowerCut(t)
}

// TestWALWritebackPowerCut: the same commit, cut by a power failure before
// its metadata sync, once the kernel has written back the newest WAL (and
// nothing of the older one) on its own. What survives must still be a
// prefix of the commit.
func TestWALWritebackPowerCut(t *testing.T) {
	t.Setenv(walOrderWritebackEnv, "1")
	walOrderPowerCut(t)
}

func walOrderPowerCut(t *testing.T) {
	fs := loopfs.Ext4FS(t, 256<<20)
	CrashChild(t, "TestWALOrderPowerCutChild", walOrderChildEnv, fs.Dir)
	if err := fs.Remount(); err != nil {
		t.Fatal(err)
	}
	st, err := OpenThin(filepath.Join(fs.Dir, "store"), ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	sv, err := st.OpenVolume(ctx, "v@s")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, BlockSize)
	err = sv.ReadBlocks(ctx, 0, got)
	sv.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{'X'}, BlockSize)) {
		t.Errorf("snapshot s block 0 reads %q..., want X: its data was lost", got[:8])
	}
	CheckThin(t, st)
}

// TestCatalogTxnAfterCommitTxnDurable: a catalog change that comes between
// two transactions of a batch commit is written only once the commit's
// transactions before it are durable (syncBeforeTxn in transact), for
// whatever it computes may rest on them. The change runs in the window the
// commit leaves between a transaction and its sync.
func TestCatalogTxnAfterCommitTxnDurable(t *testing.T) {
	st, err := OpenThin(t.TempDir(), ThinOptions{ClusterSize: BlockSize, CommitInterval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, v := openChunked(t, st, 64)
	defer v.Close()
	ctx := context.Background()
	for c := range uint64(256) { // 256 new clusters: a commit of several transactions
		if err := v.WriteBlocks(ctx, c, bytes.Repeat([]byte{'A'}, BlockSize), false); err != nil {
			t.Fatal(err)
		}
	}
	var (
		ran                  int
		written, durableAt   uint64
		beforeChunks, synced uint64
	)
	hook := func() {
		if ran++; ran > 1 {
			return
		}
		beforeChunks, synced = b.chunks.Load(), b.walSynced.Load()
		err := b.update(func(txn *badger.Txn) error {
			written, durableAt = b.chunks.Load(), b.walSynced.Load()
			return txn.Set([]byte("\xfftest"), []byte("catalog change"))
		})
		if err != nil {
			t.Error(err)
		}
	}
	b.chunkHook.Store(&hook)
	if err := v.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	b.chunkHook.Store(nil)
	if ran == 0 {
		t.Fatal("the commit was one transaction: no window between two")
	}
	if synced >= beforeChunks {
		t.Fatalf("the commit's first transaction was durable (walSynced %d, chunks %d) before the window: nothing tested", synced, beforeChunks)
	}
	if durableAt < written {
		t.Fatalf("a catalog transaction was written while commit transactions %d..%d were not yet durable", durableAt+1, written)
	}
}
