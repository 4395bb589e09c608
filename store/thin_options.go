package store

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// ThinOptions configures OpenThin. The zero value is the default.
type ThinOptions struct {
	// Logger receives the store's and badger's messages; nil means
	// slog.Default().
	Logger *slog.Logger
	// LogLevel is the lowest badger level forwarded to Logger; nil means
	// slog.LevelWarn (badger's Info messages report routine compactions).
	LogLevel slog.Leveler
	// ClusterSize is the allocation and copy-on-write unit of a new store,
	// a power of two from 4 KiB to 4 MiB; 0 means DefaultClusterSize. An
	// existing store keeps the size it was created with.
	ClusterSize int64
	// CommitInterval bounds how long map changes of writes not yet flushed
	// stay in memory before they are committed anyway; 0 means one second.
	CommitInterval time.Duration
	// MemTableSize is the size of one badger memtable; 0 means 8 MiB.
	MemTableSize int64
	// Reserve is the free space, in bytes, that data writes leave on the
	// file system of the store for its metadata: a write that would need
	// some of it fails with ErrNoSpace (thin_space.go). 0 means 2 % of the
	// file system's size, at least 64 MiB and at most 1 GiB. Half of it, up
	// to 64 MiB, the store holds in a file of its own (data/ballast), which
	// it gives to the metadata if another program fills the file system.
	Reserve int64

	// dataFileBytes is the size a data file grows to before the next
	// begins: dataFileBytes (1 TiB) but in tests, which make it small to
	// reach the files after the first (SmallDataFiles). A store must be
	// opened with the size it was created with.
	dataFileBytes int64
}

// DefaultClusterSize is the cluster size of a new thin store (see doc.go
// for the measurement that chose it).
const DefaultClusterSize = 64 << 10

const (
	// minMemTableSize keeps a transaction (15% of a memtable) large
	// enough for the catalog's operations.
	minMemTableSize       = 4 << 20
	minClusterSize        = BlockSize
	maxClusterSize        = 4 << 20
	defaultCommitInterval = time.Second
	defaultThinMemTable   = 8 << 20
)

func (o ThinOptions) withDefaults() ThinOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogLevel == nil {
		o.LogLevel = slog.LevelWarn
	}
	if o.ClusterSize == 0 {
		o.ClusterSize = DefaultClusterSize
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = defaultCommitInterval
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = defaultThinMemTable
	}
	return o
}

func (o ThinOptions) validate() error {
	switch {
	case o.ClusterSize < minClusterSize || o.ClusterSize > maxClusterSize || o.ClusterSize&(o.ClusterSize-1) != 0:
		return fmt.Errorf("ClusterSize %d: want a power of two in [%d, %d]: %w", o.ClusterSize, minClusterSize, maxClusterSize, ErrInvalid)
	case o.CommitInterval < 0:
		return fmt.Errorf("CommitInterval %v: %w", o.CommitInterval, ErrInvalid)
	case o.MemTableSize < minMemTableSize:
		return fmt.Errorf("MemTableSize %d below %d: %w", o.MemTableSize, minMemTableSize, ErrInvalid)
	}
	return nil
}

// badgerOptions are the metadata database's options: small entries (all
// in the LSM tree, none in the value log), tables read straight from
// their mapping (no compression, so no block cache; indexes kept with
// their tables), small memtables and tables: badger's memory stays under
// about 16 MiB.
func (o ThinOptions) badgerOptions(dir string) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(slogBadger{log: o.Logger.With("component", "badger"), min: o.LogLevel}).
		WithSyncWrites(false). // durability comes from the commits' syncs
		WithDetectConflicts(false).
		WithMetricsEnabled(false). // badger's metrics are process-global expvars
		WithCompression(options.None).
		WithMemTableSize(o.MemTableSize).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		WithBaseTableSize(1 << 20).
		WithValueThreshold(64 << 10).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(2).
		WithCompactL0OnClose(true).
		WithNumGoroutines(2).
		WithNumVersionsToKeep(1)
}
