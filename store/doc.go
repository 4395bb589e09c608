// Package store is the block storage behind a remote-disk target: a Store
// holds named volumes, a Volume is an array of BlockSize (4 KiB) blocks
// read and written by lba. It knows nothing of RDMA, NBD or NVMe.
//
// The backends share one implementation of the semantics (argument, name
// and overflow-safe range checks, open handles, ErrBusy, ErrClosed, errors
// wrapped in *OpError naming the volume, operation and lba; catalog.go and
// volume.go):
//
//   - OpenThin: the thin store, the default. Volume data in large sparse
//     files written in place, metadata in an embedded badger (v4)
//     database; thin volumes, snapshots, clones, rollback, and raw volumes
//     (an existing file or block device served as it is).
//   - NewMemory: sparse in-memory maps, for tests and throwaway targets,
//     with the same semantics (snapshots copy the block index).
//   - OpenRBD (build tags ceph, pacific): the images of a Ceph pool.
//
// api.go states the contract; store/storetest checks it against any
// backend (conformance and model tests).
//
// # The thin store: layout
//
// A thin store is a directory:
//
//	store.lock        flock held while a process has the store open
//	meta/             the badger database: catalog, maps, free space
//	data/000000.data  data files: physical cluster p at byte offset
//	data/000001.data  (p mod 2^k) * ClusterSize of file p div 2^k (1 TiB
//	...               per file), sparse
//	data/ballast      space held for the metadata (see running out of space)
//	rtarget.sock      rtarget serve's control socket (cmd/rtarget)
//
// The cluster (ClusterSize, 64 KiB by default, fixed when the store is
// made) is the unit of allocation and of copy on write. Cluster 0 of the
// first file holds a header naming the store (a UUID also in the format
// record), so data files and metadata of different stores are never mixed
// up; data starts at 2 MiB. Whole clusters written together are
// allocated as a contiguous run, so a large request is one system call.
// Writes are issued in pieces of at most 64 KiB (thin_pool.go, writeChunk):
// larger page-cache folios make every later 4 KiB write into them walk the
// whole folio in ext4. A write over data the page cache holds in full
// makes no folio, and goes in one piece (thin_pool.go, cached). On XFS, whose writes walk no such list, they are
// issued whole: its large folios make later reads cheaper. On XFS the
// blocks of new clusters are also allocated ahead, 1 GiB of the data file
// at a time (thin_pool.go, allocAhead): each 4 KiB write into a new
// cluster would otherwise be an allocation of its own.
//
// Why 64 KiB: the cost of a first write to a cluster shared with a
// snapshot is a read and a write of the whole cluster (BenchmarkCopyOnWrite:
// 4.7x a plain 4 KiB write at 16 KiB clusters, 10x at 64 KiB, 70x at 256
// KiB, in the store alone, on a VM where every new page cost a fault in the
// host; without those faults (RNIC_STEADY_MEMORY=1) about 6x at 64 KiB in
// CPU time; through rinit the rest of the stack dilutes it to 2.6x),
// while the map of an open volume takes 8 bytes of memory per cluster
// mapped (24 MiB for 3 volumes of 64 GiB written all over at 64 KiB, 96 MiB
// at 16 KiB). 64 KiB is also qcow2's and LVM thin's default.
//
// # The thin store: metadata
//
// Keys of the badger database (thin_keys.go); numbers are big-endian:
//
//	0x00                         format record (JSON: name, version, cluster size, UUID)
//	0x01                         last volume id assigned
//	0x02 | name                  volume record (JSON thinRecord: id, kind, size, meta,
//	                             origin, epoch, snapshot tag, rollback under way)
//	0x03 | id                    the name of volume id
//	0x04 | id                    a deleted volume whose map and deltas are still to release
//	0x05                         high-water mark: clusters ever handed out
//	0x06                         present while the store is open (absent: closed cleanly)
//	0x07 | id | epoch            a snapshot of volume id (JSON: name, epoch, time, size, deleting)
//	0x10 | id | cluster          head map entry
//	0x11 | id | epoch | cluster  snapshot delta entry
//	0x12 | physical              reference count, only when above 1
//	0x13 | first physical        free range [first, end): value end
//
// A map entry is 8 bytes (thin_map.go): the physical cluster (40 bits),
// the entry's birth epoch (22 bits), a hole bit (reads zeros, hides a
// clone's origin) and a counted bit (the cluster may have other references:
// always copied on write). An absent entry reads zeros, or for a clone its
// origin's data.
//
// Each snapshot has a key of its own (format 2), so taking, marking or
// deleting one writes that key and the volume record, whatever the number
// of snapshots; format 1 kept them in the record, which each of those
// rewrote whole (500 KB of JSON with 5,000 snapshots). The thin store
// migrates a store of format 1 when it opens it (migrateFormat1 in
// thin_store.go, resumed by the next open if interrupted); an rtarget of
// format 1 refuses a store of format 2 (its format record says so). The
// decoded records are cached (recordCache in thin_record.go), checked
// against the stored record's bytes on every lookup.
//
// # The thin store: data path
//
// An open volume's map lives in memory (a two-level array of entries, pages
// of 512 made on first use), so a read or write of an allocated cluster
// that nothing else references is one pread or pwrite on a data file,
// without touching badger; a request spanning clusters that follow each
// other in a data file is one system call. Requests lock the clusters they
// cover (reads shared, writes and discards exclusively), which makes each
// request atomic for concurrent ones. Reads of up to 64 KiB that the page
// cache holds are made without the Go scheduler's system-call path
// (pread.go); writes never are, since a write may wait in the kernel for
// as long as the file system stays frozen (pwrite.go).
//
// A write to an unallocated cluster allocates one (the lowest free one,
// else past the high-water mark; whole clusters written together get a
// contiguous, aligned run) and writes the data there; the rest of a new
// cluster reads zeros (every free cluster is a hole). A write to a cluster
// shared with a snapshot, a clone's origin or a rollback's source copies
// it first (read, merge, write the whole cluster to a new one). A read of
// an unallocated cluster returns zeros without I/O.
//
// TryReadBlocks, the read of a caller that must not block (rtarget runs
// it on the completion handler, without a hand-off to a worker), reads a
// request within one cluster no writer holds: a hole, or data the page
// cache holds (preadv2 with RWF_NOWAIT). Anything else (a clone's origin,
// which may need the database; data on disk) it leaves to ReadBlocks.
// TryWriteBlocks, its counterpart for writes, writes a request within one
// cluster no one holds the lock of: in place when the volume alone holds
// the cluster, or into a new cluster (a map change in the batch, as any
// write's) when nothing shows through it and the batch has room without a
// commit. A copy on write, a clone's origin or a full batch it leaves to
// WriteBlocks.
//
// Trim and WriteZeroes unmap whole clusters (their space is freed unless a
// snapshot holds them) and punch holes (fallocate PUNCH_HOLE) in the parts
// of clusters they cover; a part of a shared cluster is copied with zeros
// there. BlockStatus reports unmapped clusters as holes. So zeroing frees
// space, which NBD allows unless the client sets NBD_CMD_FLAG_NO_HOLE:
// then the area must stay provisioned, so that later writes there cannot
// fail for lack of space. That is WriteZeroesAllocated, which writes the
// zeros as any write (volume.go, writeZeroBlocks): an unmapped cluster
// gets a cluster of its own, a shared one is copied first (a snapshot
// keeps its data, the head's copy is the volume's alone), one the volume
// alone holds is written in place, holes of its file included, so the
// range is data in the map and in the data file. (fallocate ZERO_RANGE
// would allocate the file's blocks without writing them, but as unwritten
// extents, which SEEK_HOLE reports as holes: inPlace would then refuse
// overwrites there at the reserve.)
//
// # The thin store: durability
//
// Map changes are kept in memory, in a batch, in the order they were made
// (thin_batch.go). A commit, run by Flush, a FUA write, Sync, the volume
// operations that read the map or the space accounting (clone, rollback,
// deletion, stat and list, open), every second while the batch holds
// anything, or when it grows past 16K changes (writers wait for one past
// 64K), first fdatasyncs the data files (and their directory after a data
// file was created: a new file's name is durable only then), then writes
// the batch in badger transactions that each hold whole replacements (a map
// entry, the delta entry keeping the old one or the release of its cluster,
// the allocation from the free ranges), then syncs the database (an fsync
// of the value log, of every memtable WAL, oldest first, and of the
// directory, then db.Sync: badger v4.9.6's db.Sync covers only the mutable
// memtable's WAL and never syncs its directory; a newer WAL synced first
// could keep a later transaction without an earlier one). Each of a
// commit's transactions but the last is made durable (db.Sync) before
// the next metadata transaction, the commit's or a catalog change's, is
// written: the WALs are mapped files the kernel may write back in any
// order, a newer one before an older one's last pages. So a map entry
// never becomes durable before the data it points at, no change is ever
// durable in part, what survives a commit cut short is a prefix of it
// (TestWALOrderPowerCut, TestWALWritebackPowerCut), and a flushed or FUA
// write survives kill -9 and
// power loss (cmd/e2e's TestCrashConsistency kills rtarget; TestPowerLoss
// shuts its file system down as a power cut would, losing what was not
// synced). A failed sync (of the data files or of the
// database) fails the store: it refuses changes until it is reopened, since
// the kernel may have dropped the pages it could not write and reports that
// to an open file once, so a later sync, or one beside it on the same file,
// would succeed without them; the syncs of each file therefore run one at a
// time. Badger v4.9.6 refuses to open beside an empty memtable WAL, which a
// power cut can leave between its deletion's truncate and unlink, or its
// creation's create and extend: the open removes such files first, since
// they hold nothing (badger_open.go, TestEmptyWALPowerCut). Health
// (rtarget's /healthz) reports such a failure, and also a file system
// that can no longer write (shut down, or read-only after an error) before
// anything fails: it opens the store's files for writing. Concurrent
// callers share commits: N concurrent FUA writes cost about two. A commit
// syncs the data files before it takes the metadata lock, so a catalog
// change (a snapshot, a volume created) commits its own small transaction
// meanwhile instead of waiting for that sync (TestSnapshotBesideDataSync).
//
// Writes into newly allocated clusters start the data files' writeback
// every 16 MiB (thin_pool.go, writebackBytes), so that neither a commit's
// fdatasync nor any other fsync on the file system (ext4's ordered mode
// writes out newly allocated data first) waits for more than that: a
// snapshot of one volume right after another volume's 1 MiB writes took
// 264 ms without it.
//
// A cluster freed (its last reference gone) goes back to the free ranges
// in the same transaction as the change that freed it, is punched after
// that transaction is durable, and only then handed out again: its old
// content is never readable through another volume or a later
// allocation. A cluster a failed write had taken from the free ranges is
// punched before it goes back to them. After a crash (the 0x06 key still
// present at open), the clusters below the high-water mark that no map or
// delta entry and no free range holds become free (a commit records the
// mark as it is when it writes, past clusters that writes beside it took
// and whose map changes were still to commit: thinBackend.reclaimLeaked,
// a scan of every entry, only then), every free range is punched again (an
// allocation that was never committed may have written there) and the
// data files are cut at the high-water mark. Close syncs the data files
// after its last commit's punches, before it marks the store clean.
//
// Running out of space is an operating condition of a thin pool, which
// over-commits by design. badger writes its log through a memory map of a
// sparse file, and a page of it that finds the file system full kills the
// process (SIGBUS): so data writes leave a reserve free (ThinOptions.
// Reserve, rtarget --reserve; by default 2 % of the file system, from 64
// MiB to 1 GiB). A write that needs space past it (a new cluster, or an
// overwrite filling a hole of one while the file system is at the reserve)
// fails with ErrNoSpace, which initiators see as ENOSPC; everything else
// goes on, commits, snapshots and volume changes included, in the
// reserve. The free space is read with statfs when the writes since the
// last reading have used half of what it found above the reserve, before
// every metadata transaction, and every second (thin_space.go).
//
// A reserve only binds the store's own writes: another program can fill
// the file system past it. So half of the reserve (at most 64 MiB) is a
// file of allocated blocks, data/ballast. When the free space falls to a
// quarter of the reserve, or to the floor of 1.5 memtables, the ballast is
// deleted and its blocks are badger's; below the floor, changes that add
// metadata (volumes, snapshots, clones, attributes) fail with ErrNoSpace,
// while commits of writes, deletes, trims and rollbacks, which give space
// back, go on. The ballast is allocated again once the file system has
// room for it twice over. Measured on a 160 MiB file system filled by
// another program: the code before this died of SIGBUS at the first
// snapshot; TestThinBallast now takes 150 snapshots, trims and flushes,
// then snapshots and 60 KiB volume attributes until ErrNoSpace (about 35
// of each), and reopens with all of it.
//
// A crash loses the changes of the batch that were not committed:
// unflushed writes, as the contract allows. Each block holds its old or
// its new content (a 4 KiB aligned page is written back whole), so what
// may tear in a crash is a multi-block write, between blocks.
//
// # The thin store: snapshots, clones, rollback
//
// A volume has an epoch; entries are born in the volume's current epoch. A
// snapshot takes the current epoch (the volume moves to the next one), so
// taking one writes one record whatever the volume's size, with the
// volume's I/O stopped for that transaction only; what the batch holds
// goes to the database after it, each change naming the snapshot its old
// entry goes to (BenchmarkSnapshot). A head entry born in or
// before the latest snapshot's epoch is shared with it. When the head
// replaces such an entry (a copy on write, a trim, a rollback), the old
// entry moves into the latest snapshot's delta; otherwise its cluster is
// released. So a snapshot's content at a cluster is its own delta's entry,
// else the next snapshot's, and so on, else the head's (thin_view.go), and
// this invariant holds: the latest snapshot's delta has an entry for a
// cluster exactly when the head's entry there was born after it
// (thinBackend.check verifies it, with the reference counts and free
// ranges). Reading a snapshot resolves each cluster once per handle; when
// a volume of its clone chain has 8 or more snapshots from the one read
// on, it resolves 64 clusters at a time, with one seek per delta
// (BenchmarkSnapshotRead).
//
// A clone is a new volume whose record names its origin (volume id,
// snapshot epoch): what its own map lacks, it reads from that snapshot
// (cached in memory: a snapshot never changes). Creating one writes one
// record. A snapshot with clones cannot be deleted (ErrHasDependents).
//
// Deleting a snapshot anywhere in a chain moves each entry of its delta to
// the delta of the snapshot before it, which reads through it, unless that
// one has its own entry for the cluster (or there is none): then only the
// deleted snapshot referenced it, and it is released. Rollback makes the
// head's entries those of the snapshot where any delta from the snapshot
// on has an entry (the only clusters that differ), giving the head its
// own reference to each cluster taken (a reference count, and the counted
// bit). Deleting a volume releases its map and deltas. These three run in
// bounded transactions; the record (or a 0x04 key) keeps the operation and
// where it is, so a crash in the middle is finished at the next open.
//
// Space accounting (StatVolume): Allocated counts the clusters of the
// head's own map; Exclusive those of them born after the latest snapshot
// that have no other reference (not counted, or counted with no reference
// count left); a snapshot's Exclusive the clusters of its delta that its
// predecessor does not read through and that have no other reference.
//
// # Raw volumes
//
// CreateOptions.Raw serves an existing file or block device as it is (raw.go):
// block n is bytes n*4096 of the file, read and written with pread and
// pwrite, Flush is fdatasync, Trim and WriteZeroes punch holes
// (fallocate; zeros written where that is not supported), BlockStatus
// comes from SEEK_DATA/SEEK_HOLE. WriteZeroesAllocated zeroes a block
// device's blocks with fallocate ZERO_RANGE (the kernel's zero-out
// without unmapping) and writes zeros into a file: ZERO_RANGE would leave
// unwritten extents there, which SEEK_DATA reports as holes. Its size is
// the file's, read when it is listed or opened; it has no snapshots
// (ErrNotSupported), and a resize succeeds only to that size, changing
// nothing; deleting it forgets it and leaves the file. A raw volume whose
// file is gone (deleted, the device detached) is listed as unavailable
// (VolumeInfo.Unavailable) beside the other volumes, and opening it fails
// naming its path. Its fdatasyncs run one at a time, shared by the flushes that wait for
// one (N concurrent FUA writes cost about two), and Store.Sync and the
// close of its last handle sync what it was written since. After an
// fdatasync failed, it refuses writes and flushes until the store is
// reopened, as the thin store does after a failed sync of its own.
//
// # Integrity
//
// The thin store keeps no checksum of block data. A checksum that catches
// a torn or misdirected in-place write must live outside the block (every
// 4 KiB of a block is data) and change with it: every write becomes two
// writes that are not atomic together (so it takes two slots per block to
// tell a torn write from a crash between the two), and every read two
// reads. Measured at its cheapest, one 4-byte CRC-32C per block in a table
// in the same file (BenchmarkChecksumCost, 4 KiB at QD16 over 1 GiB),
// it costs 22-40% of the CPU of random reads and 9-14% of random writes
// (two hosts), over the 5% the store may spend. badger checks its own tables; data
// integrity is left to the file system and the device under the data files
// (or a dm-integrity device), as LVM thin and LIO's file backstore do.
//
// # Memory
//
// Data files are never mapped: the page cache holds their pages outside
// the process. The process holds the maps of open volumes (8 bytes per
// mapped cluster, in pages of 512 entries under directories of 512 pages,
// made on first use: nothing in proportion to a volume's size but 8 bytes
// per directory below the highest written; a thin volume has at most 2^40
// clusters, 64 PiB with 64 KiB clusters), the batch (at most 64K
// changes of 56 bytes), a clone's cache of its origin, and badger (8 MiB
// memtables, 1 MiB tables, no block cache).
//
// badger writes each table through a shared memory map and reads it
// there, so the metadata's pages count in the process's RSS (RssFile) as
// long as the kernel leaves them: they are clean file pages, reclaimed
// under memory pressure like the data files' cache, but they are not
// bounded by the store. Measured (cmd/e2e TestTargetRSS, 4 GiB of random
// 4 KiB writes over 3 volumes of 64 GiB, about 850,000 clusters mapped):
// 24.5 MiB of tables mapped, about 30 bytes per mapped cluster, beside
// 13.6 MiB of rtarget's own code and 50-80 MiB of Go heap.
//
// # Migration from v1
//
// The store of earlier versions kept every block as a badger value in the
// data directory itself. OpenThin refuses such a directory with ErrV1Store;
// MigrateV1 (rtarget volume migrate) copies its volumes into a thin store
// built in DIR/migrate.tmp, checking every block's CRC (a bad one stops the
// migration and leaves the v1 store as it was), then moves the v1 files to
// DIR/v1 and the thin store into DIR. Volume names with '@' or '/' get '_'.
// An interrupted migration (OpenThin: ErrMigrating) is finished by running
// it again.
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
//     as they were). WriteZeroesAllocated writes zeros (rbd_aio_write of
//     a zero buffer, 1 MiB at a time), which allocates the objects as any
//     write does.
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
