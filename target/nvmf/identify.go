package nvmf

import (
	"encoding/binary"
	"math/bits"

	"github.com/rnic-dev/rnic/store"
)

// Identify (NVMe Base 2.0 §5.17): the controller, namespace 1, the active
// namespace list and namespace 1's identification descriptors. The data
// structures are 4096 bytes, little-endian; the fields Linux checks are
// noted where they are set.

// IdentifyLen is the size of every Identify data structure.
const IdentifyLen = 4096

// CNS values answered.
const (
	CNSNamespace     = 0x00
	CNSController    = 0x01
	CNSActiveNSList  = 0x02
	CNSNSDescriptors = 0x03
	CNSCSNamespace   = 0x05 // I/O command set specific namespace (all zero for NVM)
	CNSCSController  = 0x06 // I/O command set specific controller (all zero for NVM)
)

// Controller types (CNTRLTYPE).
const (
	CntrlTypeIO        = 1
	CntrlTypeDiscovery = 2
)

// IdentifyController is the Identify Controller data structure.
type IdentifyController []byte

func (d IdentifyController) CMIC() uint8      { return d[76] }
func (d IdentifyController) MDTS() uint8      { return d[77] }
func (d IdentifyController) CntlID() uint16   { return binary.LittleEndian.Uint16(d[78:]) }
func (d IdentifyController) Ver() uint32      { return binary.LittleEndian.Uint32(d[80:]) }
func (d IdentifyController) OAES() uint32     { return binary.LittleEndian.Uint32(d[92:]) }
func (d IdentifyController) CntrlType() uint8 { return d[111] }
func (d IdentifyController) LPA() uint8       { return d[261] }
func (d IdentifyController) KAS() uint16      { return binary.LittleEndian.Uint16(d[320:]) }
func (d IdentifyController) SQES() uint8      { return d[512] }
func (d IdentifyController) CQES() uint8      { return d[513] }
func (d IdentifyController) MaxCmd() uint16   { return binary.LittleEndian.Uint16(d[514:]) }
func (d IdentifyController) NN() uint32       { return binary.LittleEndian.Uint32(d[516:]) }
func (d IdentifyController) ONCS() uint16     { return binary.LittleEndian.Uint16(d[520:]) }
func (d IdentifyController) VWC() uint8       { return d[525] }
func (d IdentifyController) SGLS() uint32     { return binary.LittleEndian.Uint32(d[536:]) }
func (d IdentifyController) SubNQN() string   { s, _ := cstring(d[768:1024]); return s }
func (d IdentifyController) IOCCSZ() uint32   { return binary.LittleEndian.Uint32(d[1792:]) }
func (d IdentifyController) IORCSZ() uint32   { return binary.LittleEndian.Uint32(d[1796:]) }
func (d IdentifyController) ICDOFF() uint16   { return binary.LittleEndian.Uint16(d[1800:]) }
func (d IdentifyController) MSDBD() uint8     { return d[1803] }

// IdentifyControllerFields are the fields of Identify Controller to encode
// (the others are zero).
type IdentifyControllerFields struct {
	SN, MN, FR string // ASCII, space-padded to 20, 40 and 8 bytes
	CMIC       uint8  // bit 1: the subsystem may have several controllers
	MDTS       uint8  // largest transfer: 2^MDTS pages of 4 KiB (CAP.MPSMIN)
	CntlID     uint16 // must equal Connect's result
	Ver        uint32
	CTRATT     uint32
	CntrlType  uint8
	ACL, AERL  uint8 // 0-based
	LPA        uint8
	KAS        uint16 // keep alive granularity in 100 ms; Linux refuses 0 on I/O controllers
	MaxCmd     uint16 // Linux sets its queue size to MaxCmd-1: never 0
	NN         uint32
	ONCS       uint16
	VWC        uint8
	SGLS       uint32 // bit 2 (keyed SGL data blocks) is mandatory for NVMe/RDMA
	SubNQN     string
	IOCCSZ     uint32 // command capsule size in 16 bytes: 4 = no in-capsule data
	IORCSZ     uint32
	MSDBD      uint8
}

// Encode writes f into d (IdentifyLen bytes).
func (d IdentifyController) Encode(f *IdentifyControllerFields) {
	clear(d[:IdentifyLen])
	padded(d[4:24], f.SN)
	padded(d[24:64], f.MN)
	padded(d[64:72], f.FR)
	d[76] = f.CMIC
	d[77] = f.MDTS
	binary.LittleEndian.PutUint16(d[78:], f.CntlID)
	binary.LittleEndian.PutUint32(d[80:], f.Ver)
	binary.LittleEndian.PutUint32(d[96:], f.CTRATT)
	d[111] = f.CntrlType
	d[258], d[259], d[261] = f.ACL, f.AERL, f.LPA
	binary.LittleEndian.PutUint16(d[320:], f.KAS)
	d[512], d[513] = 0x66, 0x44 // SQ entries of 64 bytes, CQ entries of 16
	binary.LittleEndian.PutUint16(d[514:], f.MaxCmd)
	binary.LittleEndian.PutUint32(d[516:], f.NN)
	binary.LittleEndian.PutUint16(d[520:], f.ONCS)
	d[525] = f.VWC
	binary.LittleEndian.PutUint32(d[536:], f.SGLS)
	copy(d[768:768+MaxNQNLen], f.SubNQN)
	binary.LittleEndian.PutUint32(d[1792:], f.IOCCSZ)
	binary.LittleEndian.PutUint32(d[1796:], f.IORCSZ)
	d[1803] = f.MSDBD // ICDOFF (1800) stays 0: in-capsule data right after the command
}

// padded copies s into b, filling the rest with spaces.
func padded(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

// IdentifyNamespace is the Identify Namespace data structure (NVM command
// set).
type IdentifyNamespace []byte

func (d IdentifyNamespace) NSZE() uint64         { return binary.LittleEndian.Uint64(d[0:]) }
func (d IdentifyNamespace) NCAP() uint64         { return binary.LittleEndian.Uint64(d[8:]) }
func (d IdentifyNamespace) NUSE() uint64         { return binary.LittleEndian.Uint64(d[16:]) }
func (d IdentifyNamespace) NLBAF() uint8         { return d[25] }
func (d IdentifyNamespace) FLBAS() uint8         { return d[26] }
func (d IdentifyNamespace) NMIC() uint8          { return d[30] }
func (d IdentifyNamespace) RESCAP() uint8        { return d[31] }
func (d IdentifyNamespace) DLFEAT() uint8        { return d[33] }
func (d IdentifyNamespace) NSATTR() uint8        { return d[99] }
func (d IdentifyNamespace) NGUID() [16]byte      { return [16]byte(d[104:120]) }
func (d IdentifyNamespace) LBADS() uint8         { return d[130] } // LBA format 0: log2 of the block size
func (d IdentifyNamespace) LBAFMetadata() uint16 { return binary.LittleEndian.Uint16(d[128:]) }

// IdentifyNamespaceFields are the fields of Identify Namespace to encode.
type IdentifyNamespaceFields struct {
	Blocks uint64 // NSZE = NCAP = NUSE
	LBADS  uint8
	NMIC   uint8 // bit 0: the namespace may be attached to several controllers
	RESCAP uint8
	DLFEAT uint8
	// NSATTR bit 0: the namespace is write protected (Linux then makes
	// its block device read-only).
	NSATTR uint8
	NGUID  [16]byte
}

// Encode writes f into d (IdentifyLen bytes).
func (d IdentifyNamespace) Encode(f *IdentifyNamespaceFields) {
	clear(d[:IdentifyLen])
	binary.LittleEndian.PutUint64(d[0:], f.Blocks)
	binary.LittleEndian.PutUint64(d[8:], f.Blocks)
	binary.LittleEndian.PutUint64(d[16:], f.Blocks)
	// NLBAF 0 (one format), FLBAS 0 (format 0), no metadata.
	d[30] = f.NMIC
	d[31] = f.RESCAP
	d[33] = f.DLFEAT
	d[99] = f.NSATTR
	copy(d[104:120], f.NGUID[:])
	d[130] = f.LBADS
}

// Namespace identification descriptor types (NVMe Base 2.0 Figure 277).
const (
	NIDTEUI64 = 1
	NIDTNGUID = 2
	NIDTUUID  = 3
	NIDTCSI   = 4
)

// encodeNSDescriptors writes namespace 1's identification descriptors:
// its NGUID, a UUID derived from it, and its command set (NVM).
func encodeNSDescriptors(b []byte, nguid [16]byte) {
	clear(b)
	b[0], b[1] = NIDTNGUID, 16
	copy(b[4:20], nguid[:])
	u := nguid
	u[6] = u[6]&0x0f | 0x40 // RFC 4122 version 4 and variant bits
	u[8] = u[8]&0x3f | 0x80
	b[20], b[21] = NIDTUUID, 16
	copy(b[24:40], u[:])
	b[40], b[41] = NIDTCSI, 1 // value 0: the NVM command set
}

// mdts returns MDTS for a transfer limit of n bytes (a power of two).
func mdts(n int) uint8 { return uint8(bits.Len(uint(n/store.BlockSize)) - 1) }

// identify answers Identify.
func (c *controller) identify(q *queue, sl *slot, cmd Command) {
	cns, csi := cmd.CDW(10)&0xff, cmd.CDW(11)>>24
	nsid := cmd.NSID()
	var fill func(b []byte)
	switch {
	case cns == CNSController:
		fill = c.identifyController
	case c.disc:
		q.complete(sl, 0, fail(StatusInvalidField, "Identify CNS 0x%02x on a discovery controller", cns))
		return
	case cns == CNSNamespace && nsid == 1:
		fill = c.identifyNamespace
	case cns == CNSActiveNSList && nsid < 0xfffffffe:
		fill = func(b []byte) {
			clear(b)
			if nsid < 1 {
				binary.LittleEndian.PutUint32(b, 1)
			}
		}
	case cns == CNSNSDescriptors && nsid == 1:
		fill = func(b []byte) { encodeNSDescriptors(b, c.nguid) }
	case (cns == CNSCSNamespace && nsid == 1 || cns == CNSCSController) && csi == 0:
		fill = func(b []byte) { clear(b) }
	case cns == CNSNamespace || cns == CNSNSDescriptors || cns == CNSActiveNSList || cns == CNSCSNamespace:
		// NSID FFFFFFFFh included: the capabilities common to all
		// namespaces are for a controller with Namespace Management
		// (OACS bit 3), which this one is not; without it Identify
		// Namespace of FFFFFFFFh is aborted with Invalid Namespace or
		// Format (NVM Command Set 1.0 §4.1.5.1).
		q.complete(sl, 0, fail(StatusInvalidNS, "Identify CNS 0x%02x of namespace %d", cns, nsid))
		return
	default:
		q.complete(sl, 0, fail(StatusInvalidField, "Identify CNS 0x%02x CSI %d", cns, csi))
		return
	}
	c.reply(q, sl, IdentifyLen, 0, fill)
}

// identifyController fills Identify Controller.
func (c *controller) identifyController(b []byte) {
	s := c.s
	f := IdentifyControllerFields{MN: "rnic rtarget", FR: "1.0", CntlID: c.id, Ver: nvmeVersion,
		CTRATT: 1, // 128-bit host identifiers
		ACL:    3, AERL: maxAERs - 1, LPA: lpaExtendedData, KAS: kasUnits,
		SGLS:   1<<0 | 1<<2, // SGLs, keyed SGL data blocks
		SubNQN: c.subNQN, IORCSZ: 1, MSDBD: 1, MDTS: mdts(s.cfg.MaxTransfer)}
	if c.disc {
		f.CntrlType, f.SN, f.MaxCmd, f.IOCCSZ = CntrlTypeDiscovery, "discovery", AdminQueueSize, CommandLen/16
	} else {
		f.CntrlType, f.SN, f.MaxCmd, f.NN = CntrlTypeIO, c.serial, MaxQueueSize, 1
		// Every admin queue's Connect makes a controller of the subsystem:
		// several hosts, or several paths of one (Linux refuses a second
		// controller of a subsystem that says it has one). ANA (bit 3)
		// is not offered.
		f.CMIC = cmicMultiCtrl
		// DSM, Write Zeroes, reservations; a volatile write cache (Flush
		// and FUA reach the store's sync); in-capsule data (SGLS bit 20).
		f.ONCS, f.VWC = oncsDSM|oncsWriteZeroes|oncsReservations, 1
		f.IOCCSZ = uint32(CommandLen+s.cfg.InCapsule) / 16
		if s.cfg.InCapsule > 0 {
			f.SGLS |= 1 << 20
		}
	}
	IdentifyController(b).Encode(&f)
}

// ONCS bits and the LPA bit used.
const (
	oncsDSM          = 1 << 2
	oncsWriteZeroes  = 1 << 3
	oncsReservations = 1 << 5
	lpaExtendedData  = 1 << 2 // Get Log Page takes an offset and 32-bit lengths
)

// identifyNamespace fills Identify Namespace for namespace 1: the volume,
// in 4 KiB blocks, at its size now (a host rescans after a grow); shared
// (NMIC bit 0: every controller of the subsystem has it attached);
// deallocated blocks read as zeros (DLFEAT 001b) and Write Zeroes may
// deallocate (bit 3); reservations of type Write Exclusive (RESCAP bit 1);
// write protected (NSATTR bit 0) if the volume refuses writes (a
// snapshot), which the host would otherwise learn one failed write at a
// time.
func (c *controller) identifyNamespace(b []byte) {
	f := IdentifyNamespaceFields{Blocks: c.namespaceBlocks(), LBADS: 12, NMIC: nmicShared, RESCAP: 1 << 1, DLFEAT: 0x09,
		NGUID: c.nguid}
	if c.fe.ReadOnly() {
		f.NSATTR = nsattrWriteProtected
	}
	IdentifyNamespace(b).Encode(&f)
}

// Identify bits: NSATTR bit 0 (write protected), NMIC bit 0 (shared
// namespace), CMIC bit 1 (several controllers).
const (
	nsattrWriteProtected = 1 << 0
	nmicShared           = 1 << 0
	cmicMultiCtrl        = 1 << 1
)

// reply answers a command that returns n bytes of data (Identify, Get Log
// Page, Get Features with data): its data pointer must be a keyed SGL of
// exactly n bytes; fill writes the data; result goes in the completion.
func (c *controller) reply(q *queue, sl *slot, n int, result uint64, fill func([]byte)) {
	if err := q.parseData(sl, uint32(n)); err != nil {
		q.complete(sl, 0, err)
		return
	}
	switch {
	case sl.data.InCapsule:
		q.complete(sl, 0, fail(StatusInvalidField, "in-capsule data for a command that returns data"))
		return
	case sl.data.Len != uint32(n):
		q.complete(sl, 0, fail(StatusSGLInvalidData, "SGL of %d bytes for %d bytes of data", sl.data.Len, n))
		return
	}
	q.withBuffer(sl, n, true, func(sl *slot) {
		fill(sl.buf[:n])
		q.completeData(sl, n, result)
	})
}
