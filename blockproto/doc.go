// Package blockproto defines the messages of the rnic block protocol: a
// remote disk over iWARP RDMA in which the target only advertises buffers
// (STags) and the initiator moves every byte itself with RDMA Write and
// RDMA Read, and takes locks with RDMA atomics (iSER with the roles turned
// around). This file is the protocol specification; the package holds the
// message views, their encoders and strict decoders, the authentication
// proofs and the lock table encoding. Policy (limits, timeouts, what a
// target does with a message) lives in packages target and initiator.
//
// # Transport
//
// Every message is one RDMA Send (RFC 5040) on an RC connection set up by
// the MPA exchange; some are Sends with Invalidate. All message integers are
// big-endian. A message is at most MaxMessage (1024) bytes and every
// receive buffer either side posts is at least that long, except DATA (an
// inline read's answer, below): at most 32 + MaxInline (16384) bytes, and
// an initiator that asks for inline reads of up to I bytes posts receives
// of at least 32 + I bytes. Every message starts with an 8-byte header:
//
//	0   u8   version, 1
//	1   u8   opcode
//	2   u16  flags (per opcode; unknown bits are an error)
//	4   u32  tag: a command's request tag, echoed by its answers; 0 in the
//	         login messages, REJECT and GOODBYE
//
// A receiver decodes strictly: wrong length, unknown opcode or flags,
// non-zero reserved fields, bad names or statuses are decode errors
// (*DecodeError); the target answers a malformed message by ending the QP's
// session (a protocol error), the initiator by dropping the connection.
//
// # Sessions and QPs
//
// A session is one initiator login to one volume. Its first QP logs in
// with LOGIN; more QPs join it with LOGIN and FlagJoin, naming the session
// ID; each goes through the same challenge and response. On each QP:
//
//	initiator                         target
//	LOGIN (name, volume, nonce Ni)  ->
//	                                <- CHALLENGE (nonce Nt)
//	PROOF (HMAC of LOGIN, CHALLENGE) ->
//	                                <- WELCOME (geometry, credits, lock
//	                                   table, grants, target proof)
//	                                   or REJECT (status, reason)
//
// LOGIN (opcode 0x01, flags FlagJoin 0x1, FlagInline 0x2, FlagExtents 0x4,
// FlagNoHole 0x8), 56 bytes + names:
//
//	8   u16  credits requested (queue depth of this QP), > 0
//	10  u8   initiator name length n (1-255)
//	11  u8   volume name length v (1-255)
//	12  u32  FlagInline: I, the largest inline read the initiator takes on
//	         this QP (a multiple of 512, 512-MaxInline); else 0
//	16  u64  session ID to join (FlagJoin), else 0
//	24  [32] initiator nonce Ni
//	56  [n]  initiator name, then [v] volume name (UTF-8, no control
//	         characters)
//
// CHALLENGE (0x02), 48 bytes: 8 u16 method (1 = HMAC-SHA256), 10..15
// reserved, 16 [32] target nonce Nt.
//
// PROOF (0x03), 40 bytes: 8 [32] initiator proof.
//
// WELCOME (0x04, flags FlagInline, FlagExtents, FlagNoHole), 104 bytes (112
// with FlagInline) + 16 per grant:
//
//	8   u64  session ID (random, non-zero)
//	16  u64  target boot ID (random per target process start)
//	24  u64  volume size in bytes (a multiple of min I/O)
//	32  u32  volume ID (the store's)
//	36  u32  max transfer: the largest READ/WRITE/WRITE_REQ length
//	40  u32  grant size: the data capacity of a write grant
//	44  u16  credits granted on this QP, > 0
//	46  u8   the session's reservation slot (0-62)
//	47  u8   g, number of grants that follow (<= 16)
//	48  u32  lock table STag
//	52  u32  number of numbered locks
//	56  u64  lock table TO (of word 0; 8-byte aligned)
//	64  u16  min I/O: offsets and lengths are multiples of it (512)
//	66  u16  preferred I/O: the store's block size (4096)
//	68  u32  volume flags: 0x1 read-only
//	72  [32] target proof
//	104 u32  FlagInline only: the inline limit L of this QP, a multiple of
//	         min I/O, 0 < L <= the LOGIN's I
//	108 u32  FlagInline only: reserved, 0
//	104 [g]  grants (buffer descriptors, below); at 112 with FlagInline
//
// The target sets FlagInline only if the LOGIN did and it answers inline
// reads; then READs of at most L bytes may ask for DATA (below). Without
// the flag the WELCOME has no inline limit field: its grants start at 104.
//
// REJECT (0x05) has the RESPONSE layout (below), tag 0, no grant and a
// status other than OK; the target closes the QP after it. A LOGIN with
// another version byte than 1 is answered with a version-1 REJECT with
// StatusVersion and Value = the highest version the target speaks.
//
// Inline reads are a feature of version 1 negotiated per QP: targets that
// predate them refuse a LOGIN with FlagInline as malformed (REJECT,
// StatusProtocol). An initiator that gets that REJECT to a LOGIN asking for
// inline reads logs in again without FlagInline (and need not ask that
// target again); it never assumes inline reads without a WELCOME that has
// FlagInline.
//
// # Authentication
//
// Initiator and target share a secret per initiator name; it never
// crosses the wire. With "||" concatenation and every field preceded by its
// length as a u32:
//
//	initiator proof = HMAC-SHA256(secret, "rnic-block v1 initiator proof"
//	                  || LOGIN || CHALLENGE)
//	target proof    = HMAC-SHA256(secret, "rnic-block v1 target proof"
//	                  || LOGIN || CHALLENGE || PROOF || WELCOME')
//
// where LOGIN, CHALLENGE and PROOF are the whole messages as sent and
// WELCOME' is the WELCOME with its proof field zeroed. The target checks
// the initiator proof (constant-time) before it reveals anything about the
// volume; the initiator checks the target proof before it uses the
// session, so authentication is mutual and the WELCOME's contents are
// authenticated too. Both nonces are 32 bytes from crypto/rand: a recorded
// PROOF is useless on another connection (the target's nonce differs), and
// a recorded WELCOME is useless to a fake target (the initiator's nonce
// differs). A join is authenticated the same way, and its LOGIN carries the
// session ID, so the proof binds it. An empty secret is refused on both
// sides. The target sends its proof only to an initiator that proved
// itself, so an unauthenticated peer learns no HMAC output; an initiator
// that connects to a fake target does reveal one proof over a nonce pair
// half chosen by the fake, which is what CHAP-like schemes accept (choose
// secrets too long to guess offline).
//
// # Credits
//
// iWARP has no receiver-not-ready retry: a Send that finds no posted
// receive kills the connection. The WELCOME grants C credits on the QP:
// the initiator has at most C exchanges in flight on it, each identified
// by a slot 0..C-1 carried in the low 16 bits of the tag (the high 16 bits
// are free for the initiator, e.g. a sequence number). A slot is busy from
// its command until the exchange's last message (below); a command on a
// busy slot, or on a slot >= C, is a protocol error.
//
// An exchange sends at most two initiator messages (READ then RELEASE,
// WRITE_REQ then WRITE) and the target answers each command with exactly
// one message (READY, DATA or RESPONSE; after a WRITE_REQ's READY, the
// WRITE's RESPONSE). The target processes its receive queue in order and reposts
// each receive before it acts on it, so an answer to a message proves that
// every earlier message's receive was reposted; hence at most 2 messages
// per slot are ever unprocessed and the target keeps 2C receives posted.
// The target sends at most one message per slot at a time plus one
// GOODBYE, so the initiator keeps C+1 receives posted (each large enough
// for a DATA if it asked for inline reads: any of them may get one). The
// last message of an exchange:
//
//	READ          READY (then RELEASE, which ends the exchange), or
//	              RESPONSE with an error
//	READ inline   DATA, or RESPONSE with an error
//	BLOCK_STATUS  EXTENTS, or RESPONSE with an error
//	WRITE_REQ     READY, then the WRITE's RESPONSE; or RESPONSE with an
//	              error; or READY then RELEASE of that buffer (abandoned)
//	other         RESPONSE
//
// # Buffer descriptors and STags
//
// A descriptor ("grant" when it is a write grant) is 16 bytes:
//
//	0   u32  STag (0: none; then length and TO are 0)
//	4   u32  length in bytes (> 0)
//	8   u64  TO of the first byte
//
// Every STag the target advertises names one request's buffer and nothing
// else, is registered by Fast-Register with a fresh random key on an STag
// of the session's own protection domain, and is invalidated before its
// buffer is reused; no STag spans the volume.
//
// # Commands
//
// Commands (initiator to target) are 32 bytes:
//
//	8   u64  offset in bytes (HOLDER: the slot asked about)
//	16  u32  length in bytes
//	20  u32  STag (WRITE: the buffer its Send with Invalidate names;
//	         RELEASE: the buffer released)
//	24  u64  fencing token (WRITE, TRIM, WRITE_ZEROES; 0: unfenced)
//
// Fields a command does not use are zero. Offsets and lengths of READ,
// WRITE, WRITE_REQ, TRIM and WRITE_ZEROES are multiples of the WELCOME's
// min I/O (512); READ, WRITE and WRITE_REQ lengths are at most max
// transfer; the range lies inside the volume. Otherwise the RESPONSE says
// StatusInvalid, StatusTooLarge or StatusRange.
//
//	READ (0x10, Inline)  offset, length. The target reads the data into a
//	                     buffer, fast-registers exactly those bytes
//	                     remote-read-only and sends READY naming them. The
//	                     initiator RDMA-Reads them, then sends RELEASE as a
//	                     Send with Invalidate naming the STag. A buffer not
//	                     released within the target's lease, or at session
//	                     end, is invalidated locally.
//	                     With FlagInline (0x2; only on a QP whose WELCOME
//	                     has FlagInline, length <= its L; otherwise
//	                     StatusTooLarge) the target answers with DATA
//	                     carrying the bytes, and the exchange ends there: no
//	                     STag, no RDMA Read, no RELEASE. The store checks
//	                     every block's checksum before the data is sent, as
//	                     for READY; a failure is a RESPONSE with the error.
//	WRITE (0x11, FUA)    offset, length, STag, token; sent as a Send with
//	                     Invalidate naming STag after RDMA-Writing the data
//	                     into it: into a write grant from the grant's TO
//	                     (whatever the offset's alignment), length <= grant
//	                     size; or into a WRITE_REQ's buffer at the READY's
//	                     TO. The stream's
//	                     ordering places the data and revokes the STag
//	                     before the target sees the command. A WRITE that
//	                     arrives without invalidating exactly its STag is a
//	                     protocol error. The target stores only bytes the
//	                     initiator placed since the buffer was registered:
//	                     a WRITE whose length was not placed in full from
//	                     the buffer's first byte (one RDMA Write, or
//	                     several in ascending order without a gap) is
//	                     refused with StatusInvalid and stores nothing.
//	WRITE_REQ (0x15)     offset, length: the two-step path for writes
//	                     larger than a grant (or when the initiator has no
//	                     grant). The target registers a buffer remote-
//	                     write-only for that request and sends READY; the
//	                     initiator writes and sends WRITE (same slot), or
//	                     RELEASE to abandon it.
//	FLUSH (0x12)         everything acknowledged before the FLUSH was
//	                     received is durable when it completes.
//	TRIM (0x13)          offset, length, token: the whole 4096-byte blocks
//	                     inside the range are discarded (read as zeros);
//	                     partial blocks at the ends are left alone.
//	WRITE_ZEROES (0x14)  offset, length, token, FUA: the range reads as
//	                     zeros; the target may free its blocks (punch
//	                     holes). With FlagNoHole (0x8; only on a QP whose
//	                     WELCOME has FlagNoHole, otherwise StatusInvalid)
//	                     the range also stays allocated (NBD's
//	                     NBD_CMD_FLAG_NO_HOLE): the store keeps or gives it
//	                     blocks of the volume's own (copying blocks a
//	                     snapshot shares), so a later write there does not
//	                     fail for lack of space, and BLOCK_STATUS reports
//	                     it as data.
//	RELEASE (0x16)       STag, sent as a Send with Invalidate naming it:
//	                     ends a READ's exchange (or abandons a WRITE_REQ's
//	                     buffer). No answer.
//	HOLDER (0x17)        offset = a reservation slot: RESPONSE with Value =
//	                     the session ID in that slot (0: none) and Detail =
//	                     its initiator name.
//	BLOCK_STATUS (0x18)  offset, length: EXTENTS describing the allocation
//	                     of the range from its offset on (only on a QP
//	                     whose WELCOME has FlagExtents).
//
// FUA: the RESPONSE is sent after the data is durable (store sync).
//
// # Answers
//
// RESPONSE (0x20), also REJECT (0x05) and GOODBYE (0x22), 40 bytes +
// detail:
//
//	8   u16  status
//	10  u8   detail length d (<= 255)
//	11  [5]  reserved, 0
//	16  u64  value: StatusReserved: the reservation word seen; StatusStale-
//	         Token: the fence floor; HOLDER: a session ID; StatusVersion:
//	         the highest version; GOODBYE: 1 if synced; otherwise 0
//	24  [16] a new write grant (STag 0: none)
//	40  [d]  detail: UTF-8 text for people, e.g. the holder's initiator
//	         name with StatusReserved
//
// READY (0x21), 40 bytes: 8 [16] the request's buffer descriptor, 24 [16] a
// new write grant (STag 0: none).
//
// DATA (0x23), 32 bytes + n, the answer to a READ with FlagInline:
//
//	8   [16] a new write grant (STag 0: none)
//	24  u32  n, the data length: the READ's length (1-MaxInline)
//	28  u32  reserved, 0
//	32  [n]  the data
//
// A RESPONSE with StatusOK never answers a READ: its success is READY or
// DATA.
//
// EXTENTS (0x24), 32 bytes + 8n, the answer to a BLOCK_STATUS:
//
//	8   [16] a new write grant (STag 0: none)
//	24  u32  n, the number of descriptors (1-MaxExtents, 124)
//	28  u32  reserved, 0
//	32  [8n] descriptors: u32 length in bytes (a positive multiple of min
//	         I/O), u32 flags: 0x1 hole (not allocated), 0x2 reads as zeros
//
// The descriptors are consecutive from the BLOCK_STATUS's offset and
// cover at most its length (they stop early when there are more than n,
// or on a whole-block boundary inside the volume); the initiator asks
// again from where they end. BLOCK_STATUS and EXTENTS are negotiated per
// QP: a LOGIN with FlagExtents says the initiator may send BLOCK_STATUS
// and takes EXTENTS, the WELCOME's FlagExtents says the target answers it.
// Targets that predate them refuse such a LOGIN as malformed (REJECT,
// StatusProtocol): the initiator logs in again without the flag, as with
// FlagInline.
//
// WRITE_ZEROES with FlagNoHole is negotiated the same way, per QP: a LOGIN
// with FlagNoHole says the initiator may send it, the WELCOME's FlagNoHole
// says the target honours it, and a target sets it only in answer to a
// LOGIN that has it (an initiator that predates it refuses a WELCOME with
// the flag as malformed). Targets that predate it refuse such a LOGIN
// (StatusProtocol), and decode a command with the flag as malformed,
// which ends the session: so an initiator sends it only on a QP whose
// WELCOME has FlagNoHole. Without it, an initiator that must keep a range
// allocated writes zeros there with WRITE, which every store allocates.
//
// GOODBYE (0x22): the target is ending the session (shutdown); commands
// still outstanding get no answer and the QP closes. The initiator may
// reconnect and replay them. Value 1 (GoodbyeSynced): the target flushed
// after the last answer it sent, so every write acknowledged on the
// session is durable. A target shutting down while a QP logs in may send
// GOODBYE in place of WELCOME: the login failed, and may be retried.
//
// Write grants are per QP. The target keeps at most C of them outstanding
// on a QP and tops the initiator up through RESPONSEs, READYs and DATAs; a
// WRITE consumes the grant it invalidates.
//
// # Locks
//
// The WELCOME names a lock table in target memory: 8-byte words in the
// target's native byte order at TO = LockTO + 8*i, registered for the
// session with Remote Atomic rights only (RFC 7306 Fetch-and-Add and
// Compare-and-Swap, which the target's RNIC executes with sync/atomic on
// the same memory the target reads):
//
//	word 0       reservation
//	word 1       generation counter
//	words 2-7    reserved, 0
//	word 8+n     numbered lock n (n < number of locks)
//
// Reservation word (Reservation): 0 = free; bit 63 set = exclusive, the
// one set bit among 0-62 is the holder's slot; bit 63 clear and non-zero =
// shared, bit s set for every holder slot s. Take exclusive: CAS 0 ->
// bit63|1<<s. Release it: CAS bit63|1<<s -> 0. Take shared: read (Fetch-
// and-Add 0), then CAS old -> old|1<<s while bit 63 is clear. Release
// shared: CAS old -> old&^(1<<s). Enforcement by the target, at the moment
// it executes a WRITE, TRIM or WRITE_ZEROES: allowed when the word is 0 or
// exclusive by the sender's slot; otherwise StatusReserved, Value = the
// word, Detail = the name of the (lowest) holder.
//
// Numbered lock word: 0 = free; held = (s+1)<<56 | q, where s is the
// holder's slot and q a 56-bit value the holder chooses per acquisition.
// Take: CAS 0 -> value; release: CAS value -> 0. Locks are exclusive.
//
// Generation and fencing: a token is the value of word 1 after a Fetch-
// and-Add of 1 (the returned value + 1). The target keeps a fence floor F
// per volume, in its own memory (not in the table). When a session ends
// (QP lost, logout, target shutdown), the target clears the session's slot
// from the reservation word and every numbered lock whose holder is its
// slot; if it cleared anything it adds 1 to the generation counter and sets
// F to the new value. A non-zero token T in a WRITE, TRIM or WRITE_ZEROES
// is stale when T <= F or T > the counter's current value (never issued);
// a stale command changes nothing and is answered StatusStaleToken with
// Value = F. The check and the store write happen under the volume's fence
// lock, which clearing takes, so a command that completes after the clear
// was checked against the new floor. Token 0 means unfenced. Tokens thus
// protect a lock holder's writes against any holder whose session ended
// before them: after the end every earlier token is stale, so writes
// replayed from the ended session (or delayed in it) cannot land after a
// new holder took the lock. A holder whose token went stale because some
// other session ended draws a new one. The counter starts above every
// token an earlier incarnation issued: at the wall clock in nanoseconds,
// or, for a volume several targets serve in turn (gateways in front of a
// shared store such as Ceph RBD), at the fencing epoch the target raised
// when it took the volume over, shifted left by 40 bits; a token drawn at
// the previous gateway is then below the floor, whatever the clocks say.
// Locks and reservations do not move with the volume to another target:
// the new one starts with an empty table.
//
// The table is shared by every session of the volume: the locks are
// cooperative among authenticated initiators. What the target enforces is
// the reservation rule above, the fence floor, and the clean-up at session
// end.
package blockproto
