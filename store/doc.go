// Package store is the block storage behind a remote-disk target: a Store
// holds named volumes, a Volume is an array of BlockSize (4 KiB) blocks
// read and written by lba. It knows nothing of RDMA or NBD.
//
// Two backends share one implementation of the semantics (argument and
// overflow-safe range checks, open handles, ErrBusy, ErrClosed, errors
// wrapped in *OpError naming the volume, operation and lba):
//
//   - OpenBadger: an embedded badger (v4) database in a directory, the
//     default.
//   - NewMemory: sparse in-memory maps, for tests and throwaway targets.
//
// # Semantics
//
// Blocks never written read as zeros (storage is sparse); Trim and
// WriteZeroes delete blocks, which then read as zeros. A WriteBlocks of up
// to MaxAtomicWrite bytes is atomic, also across a crash: readers see all
// of its blocks or none, and of overlapping concurrent writes the last one
// wins for every block they share. ReadBlocks sees one snapshot. A request
// reaching past the end of the volume fails with ErrOutOfRange and does
// nothing. Volume ids are assigned from a counter, never reused, and stable
// across restarts; opening a store never changes an existing volume, and
// CreateVolume on an existing name fails with ErrExists. DeleteVolume
// refuses (ErrBusy) while the volume has open handles.
//
// # Badger key layout
//
// The first byte of a key says what it is:
//
//	0x00                              format marker, value "rnic-store v1"
//	0x01                              last volume id assigned (4 bytes BE)
//	0x02 | name                       volume record (JSON: name, id, size, created, meta)
//	0x03 | id (4 BE)                  volume deleted, blocks still to reap
//	0x10 | id (4 BE) | lba (8 BE)     one block
//
// A volume's blocks are therefore contiguous and in lba order, so Trim and
// WriteZeroes find the blocks present in a range with a key-only scan and
// delete just those, however large the range, in transactions kept under
// badger's limits (db.MaxBatchCount, db.MaxBatchSize). DeleteVolume removes
// the record and sets the 0x03 marker in one transaction, then deletes the
// blocks in bounded batches; if it is interrupted (crash, cancelled
// context) the store's background goroutine finishes the job, and since
// ids are never reused the leftover blocks are never visible.
//
// A directory holding another badger database (keys but no format marker)
// is refused with ErrCorrupt. A second Store on the same directory, in this
// process or another, fails with ErrLocked (flock on store.lock, besides
// badger's own lock).
//
// # Checksums
//
// A block's value is 4100 bytes: the CRC-32C (rnic/crc32c) of the 4096
// data bytes, big-endian, then the data. Every read checks the length and
// the CRC; a mismatch fails the read with ErrChecksum and zeroes the
// caller's buffer, so bad data is never returned. This catches corruption
// badger does not: with VerifyValueChecksum off (the default) badger does
// not check its own value-log CRC on reads, and when it opens a database
// whose active value log file is damaged it truncates the file at the
// damage and then serves the lost values as empty, without an error; both
// become ErrChecksum here.
//
// # Durability
//
// Writes are not synced as they go (SyncWrites off). Flush, FUA writes, FUA
// write-zeroes, Store.Sync, volume creation and deletion sync the database
// before they return. A sync covers everything committed before it began.
// Syncs are grouped: if one is running, later callers share the single
// sync queued behind it, so N concurrent FUA writes cost about two syncs,
// not N. A sync is db.Sync() plus an fsync of every memtable WAL (*.mem)
// and of the directory: db.Sync in badger v4.9.6 syncs only the mutable
// memtable's WAL and the value log, not the WALs of full memtables still
// waiting to be flushed to tables, and badger never syncs the directory
// entries of the files it creates.
//
// # Memory budget
//
// The defaults keep a fully written 1 GiB volume at roughly 256 MiB of RSS
// (TestBadgerRSS1GiB measures it, writing and reading 1 GiB): 16 MiB
// memtables (at most 2), 8 MiB block cache, 16 MiB index cache, no
// compression, 2 compactors, 32 MiB value log files, and a value threshold
// of 1 KiB so every block value lives in the value log and the LSM tree
// holds only keys and value pointers. badger reads and writes its value
// log through mmap, and every page touched stays mapped, and counted in
// the RSS, until the kernel needs memory (a read fault maps up to 16
// neighbouring cached pages too). So, checked every 4 MiB of block writes
// and every 16 blocks read, when the process's file-backed RSS exceeds
// BadgerOptions.MappedBudget (96 MiB) the store takes the pages of the
// finished value log files out of the process with MADV_DONTNEED
// (pageOutValueLogs), which leaves them in the page cache: a later read
// costs a minor fault, not a disk read. Checks queue behind a trim under
// way, so readers do not run past the budget meanwhile. The file badger
// appends to is left alone (badger may remap it at any moment); the value
// log file size bounds its share. Value log GC, the only deleter of
// finished files, never runs at the same time as MADV_DONTNEED: while it
// runs, an over-budget check evicts with MADV_PAGEOUT instead, which is
// safe on whatever the range holds but drops the pages from the page
// cache too. The cost is the
// faults: random reads over a working set larger than the budget fault
// their pages back in; MappedBudget -1 turns this off (rtarget serve
// --mapped-budget off), and the RSS then grows with the page cache the
// volume uses.
//
// Value log GC runs every GCInterval (one minute) in a goroutine owned by
// the store, so space of overwritten and trimmed blocks is reclaimed;
// CompactL0OnClose makes Close compact, which lets a store that was
// written only a little still find its garbage. badger's log messages go to
// a log/slog Logger, at Warn and above by default.
//
// # The rbd backend
//
// With the build tags ceph and pacific, OpenRBD serves the images of a Ceph
// pool (or RADOS namespace) as volumes; rtarget then is a gateway in front
// of the cluster, and several gateways may serve one image, one at a time.
//
//   - Records: a volume's ID (from a counter object of the pool, never
//     reused), its Meta (keys rtarget.meta.*) and its fencing epoch
//     (rtarget.epoch) are image metadata; Created is the image's creation
//     time. Snapshots, clones (format 2: no protection needed), rollback
//     and resize are RBD's own; space figures come from the object map
//     (whole objects, as "rbd du" counts them).
//   - Durability: librbd runs with rbd_cache off, so a write is on every
//     replica when it is acknowledged; Flush is rbd_flush, FUA needs
//     nothing more. Trim and WriteZeroes are rbd_discard with 4 KiB
//     granularity and partial discards not skipped, so every block in the
//     range reads as zeros (librbd's defaults leave discards under 64 KiB
//     as they were).
//   - Atomicity: RADOS applies an operation on one object (4 MiB, block
//     aligned) atomically. A request within one object is atomic as it is;
//     a request spanning objects takes range locks of the objects it
//     covers, so concurrent requests through one store see each other
//     whole, as the Volume contract asks. Across a crash (of the gateway
//     or of the cluster) a write spanning objects may survive in part, per
//     object; each block is old or new, never a mix, which is exactly the
//     crash contract of Volume: nothing is narrowed.
//   - Timeouts: RBDOptions.Timeout bounds a block request; a full or
//     unreachable cluster fails it with an error instead of hanging.
//   - Take-over: opening a volume (its head) takes the image's exclusive
//     lock on a librados client instance of its own, breaking the lock of
//     any other holder, which blocklists that holder's instance: from then
//     on the cluster refuses everything it sends (ErrFenced), writes it had
//     in flight included. The epoch in the image metadata is then raised;
//     the handle is a Fencer, and the target starts the volume's fencing
//     tokens above every token of earlier holders.
package store
