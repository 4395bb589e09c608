package store

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// BadgerOptions configures OpenBadger. The zero value is the default: a
// memory budget of roughly 256 MiB RSS for a fully written 1 GiB volume.
type BadgerOptions struct {
	// Logger receives badger's log messages; nil means slog.Default().
	Logger *slog.Logger
	// LogLevel is the lowest badger level forwarded; nil means slog.LevelWarn
	// (badger's Info messages report routine compactions).
	LogLevel slog.Leveler

	// MemTableSize is the size of one memtable; 0 means 16 MiB. It also
	// bounds a transaction: badger allows 15% of it per transaction.
	MemTableSize int64
	// NumMemtables is how many memtables may exist (one mutable, the rest
	// waiting to be flushed); 0 means 2.
	NumMemtables int
	// BlockCacheSize and IndexCacheSize bound badger's caches of LSM table
	// blocks and indexes; 0 means 8 MiB and 16 MiB.
	BlockCacheSize int64
	IndexCacheSize int64
	// ValueLogFileSize is the size of one value log file, the unit of value
	// log GC; 0 means 32 MiB. The file being appended to stays mapped whole
	// (see MappedBudget), so this also bounds that part of the RSS.
	ValueLogFileSize int64

	// MappedBudget bounds the file-backed part of the process's RSS: badger
	// maps its value log files, and every page written or read stays mapped
	// until the kernel needs memory. Whenever the process's RssFile exceeds
	// MappedBudget, the store takes the value log pages out of the process
	// (madvise; Linux only; see the package documentation). 0 means 96 MiB;
	// negative disables it.
	MappedBudget int64

	// GCInterval is how often value log GC runs; 0 means one minute, a
	// negative value disables the periodic GC.
	GCInterval time.Duration
	// GCDiscardRatio is the fraction of a value log file that must be
	// garbage for GC to rewrite it; 0 means 0.5.
	GCDiscardRatio float64
}

// Defaults of BadgerOptions.
const (
	defaultMemTableSize     = 16 << 20
	defaultNumMemtables     = 2
	defaultBlockCacheSize   = 8 << 20
	defaultIndexCacheSize   = 16 << 20
	defaultValueLogFileSize = 32 << 20
	defaultMappedBudget     = 96 << 20
	defaultGCInterval       = time.Minute
	defaultGCDiscardRatio   = 0.5

	// valueThreshold keeps volume records in the LSM tree and sends every
	// block value (blockValueLen bytes) to the value log, so the LSM tree
	// holds 13-byte keys and value pointers only.
	valueThreshold = 1 << 10
)

// withDefaults returns o with zero fields replaced by defaults.
func (o BadgerOptions) withDefaults() BadgerOptions {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogLevel == nil {
		o.LogLevel = slog.LevelWarn
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = defaultMemTableSize
	}
	if o.NumMemtables == 0 {
		o.NumMemtables = defaultNumMemtables
	}
	if o.BlockCacheSize == 0 {
		o.BlockCacheSize = defaultBlockCacheSize
	}
	if o.IndexCacheSize == 0 {
		o.IndexCacheSize = defaultIndexCacheSize
	}
	if o.ValueLogFileSize == 0 {
		o.ValueLogFileSize = defaultValueLogFileSize
	}
	if o.MappedBudget == 0 {
		o.MappedBudget = defaultMappedBudget
	}
	if o.GCInterval == 0 {
		o.GCInterval = defaultGCInterval
	}
	if o.GCDiscardRatio == 0 {
		o.GCDiscardRatio = defaultGCDiscardRatio
	}
	return o
}

// badgerOptions translates o (with defaults applied) for badger.Open.
func (o BadgerOptions) badgerOptions(dir string) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(slogBadger{log: o.Logger.With("component", "badger"), min: o.LogLevel}).
		WithSyncWrites(false). // durability comes from db.Sync on Flush and FUA
		WithDetectConflicts(false).
		WithMetricsEnabled(false). // badger's metrics are process-global expvars
		WithCompression(options.None).
		WithMemTableSize(o.MemTableSize).
		WithNumMemtables(o.NumMemtables).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBlockCacheSize(o.BlockCacheSize).
		WithIndexCacheSize(o.IndexCacheSize).
		WithValueThreshold(valueThreshold).
		WithValueLogFileSize(o.ValueLogFileSize).
		WithNumCompactors(2).
		WithCompactL0OnClose(true).
		WithNumGoroutines(2).
		WithNumVersionsToKeep(1)
}

func (o BadgerOptions) validate() error {
	switch {
	case o.MemTableSize < minMemTableSize:
		return fmt.Errorf("MemTableSize %d below %d: %w", o.MemTableSize, minMemTableSize, ErrInvalid)
	case o.NumMemtables < 1:
		return fmt.Errorf("NumMemtables %d: %w", o.NumMemtables, ErrInvalid)
	case o.ValueLogFileSize < minValueLogFile || o.ValueLogFileSize > maxValueLogFile:
		return fmt.Errorf("ValueLogFileSize %d outside [%d, %d]: %w", o.ValueLogFileSize, minValueLogFile, maxValueLogFile, ErrInvalid)
	case o.BlockCacheSize < 0 || o.IndexCacheSize < 0:
		return fmt.Errorf("negative cache size: %w", ErrInvalid)
	case !(o.GCDiscardRatio > 0 && o.GCDiscardRatio < 1):
		return fmt.Errorf("GCDiscardRatio %v outside (0, 1): %w", o.GCDiscardRatio, ErrInvalid)
	}
	return nil
}
