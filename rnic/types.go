package rnic

import "fmt"

// STag is a steering tag: a 24-bit index assigned by the RNIC and an 8-bit
// key chosen by the consumer (draft §7.2). STag 0 is reserved.
type STag uint32

// MakeSTag builds an STag from its index and key.
func MakeSTag(index uint32, key uint8) STag { return STag(index<<8 | uint32(key)) }

// Index is the upper 24 bits.
func (s STag) Index() uint32 { return uint32(s) >> 8 }

// Key is the lower 8 bits.
func (s STag) Key() uint8 { return uint8(s) }

// WithKey returns the STag with its key replaced.
func (s STag) WithKey(k uint8) STag { return MakeSTag(s.Index(), k) }

func (s STag) String() string { return fmt.Sprintf("0x%08x", uint32(s)) }

// Access is a set of access rights of a memory region or window (draft §7.4,
// plus RFC 7306 remote atomic access).
type Access uint8

const (
	LocalRead    Access = 1 << iota // source of Sends and RDMA Writes
	LocalWrite                      // sink of Receives and atomic results
	RemoteRead                      // source of inbound RDMA Read Requests (needs LocalRead)
	RemoteWrite                     // sink of inbound RDMA Writes and Read Responses (needs LocalWrite)
	RemoteAtomic                    // target of inbound Atomic Requests (needs LocalWrite)
	MWBind                          // memory windows may be bound to the region
)

// Remote reports whether any remote right is set.
func (a Access) Remote() bool { return a&(RemoteRead|RemoteWrite|RemoteAtomic) != 0 }

func (a Access) String() string {
	s := ""
	for _, r := range []struct {
		a Access
		n string
	}{{LocalRead, "LR"}, {LocalWrite, "LW"}, {RemoteRead, "RR"}, {RemoteWrite, "RW"}, {RemoteAtomic, "RA"}, {MWBind, "BIND"}} {
		if a&r.a != 0 {
			if s != "" {
				s += "|"
			}
			s += r.n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// valid checks the combination rules of draft Fig. 18: at least one local
// right; remote write and remote atomic need local write; remote read needs
// local read.
func (a Access) valid() bool {
	if a&(LocalRead|LocalWrite) == 0 {
		return false
	}
	if a&RemoteWrite != 0 && a&LocalWrite == 0 {
		return false
	}
	if a&RemoteAtomic != 0 && a&LocalWrite == 0 {
		return false
	}
	if a&RemoteRead != 0 && a&LocalRead == 0 {
		return false
	}
	return true
}

// SGE is a scatter/gather element: a local buffer named by the STag of a
// registered memory region, a tagged offset and a length (draft §8.1.3.2).
type SGE struct {
	STag STag
	TO   uint64
	Len  uint32
}

// RemoteAddr is a buffer at the peer: an STag it advertised and a tagged offset.
type RemoteAddr struct {
	STag STag
	TO   uint64
}

// WROp is a work request operation type (draft Fig. 27, plus RFC 7306).
type WROp uint8

const (
	WRSend WROp = iota + 1
	WRSendSE
	WRSendInv
	WRSendSEInv
	WRWrite
	WRWriteImm // RDMA Write followed by Immediate Data (RFC 7306 §6)
	WRRead
	WRReadInv // RDMA Read with Invalidate Local STag (the Read's sink, Local.STag)
	WRImmediate
	WRImmediateSE
	WRFetchAdd // RFC 7306 masked Fetch-and-Add
	WRCmpSwap  // RFC 7306 masked Compare-and-Swap
	WRBindMW
	WRFastReg
	WRInvalidate // Invalidate Local STag
	WRRecv       // receive completions only
)

var wrOpNames = [...]string{
	WRSend: "send", WRSendSE: "send-se", WRSendInv: "send-inv", WRSendSEInv: "send-se-inv",
	WRWrite: "write", WRWriteImm: "write-imm", WRRead: "read", WRReadInv: "read-inv",
	WRImmediate: "immediate", WRImmediateSE: "immediate-se", WRFetchAdd: "fetch-add",
	WRCmpSwap: "cmp-swap", WRBindMW: "bind-mw", WRFastReg: "fast-reg",
	WRInvalidate: "invalidate", WRRecv: "recv",
}

func (o WROp) String() string {
	if int(o) < len(wrOpNames) && wrOpNames[o] != "" {
		return wrOpNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

func (o WROp) isSend() bool {
	return o == WRSend || o == WRSendSE || o == WRSendInv || o == WRSendSEInv
}

func (o WROp) isReadLike() bool {
	return o == WRRead || o == WRReadInv || o == WRFetchAdd || o == WRCmpSwap
}

func (o WROp) isAtomic() bool { return o == WRFetchAdd || o == WRCmpSwap }

func (o WROp) isLocalMemOp() bool { return o == WRBindMW || o == WRFastReg || o == WRInvalidate }

// SendWR is a work request for the send queue. Which fields matter depends on
// Op (draft Fig. 27); the others are ignored.
type SendWR struct {
	ID         uint64
	Op         WROp
	Unsignaled bool // no completion on success (errors always complete)
	ReadFence  bool // wait for earlier RDMA Reads and atomics to complete first
	LocalFence bool // wait for all earlier WRs to complete first (Invalidate)

	// SGL is the data source of Sends, Writes and Immediate-less messages.
	SGL []SGE
	// Local is the sink of an RDMA Read (whole length) or of an atomic's
	// original value (8 bytes). WRReadInv invalidates Local.STag once the
	// Read Response is placed, before the WR completes (draft §8.1.2.3,
	// §8.2.2.1: the "Local Address" STag of RDMA Read with Invalidate Local
	// STag).
	Local SGE
	// Remote is the peer buffer of Writes, Reads and atomics.
	Remote RemoteAddr
	// InvalidateSTag is the peer STag named by Send with Invalidate
	// (WRSendInv, WRSendSEInv) and the local STag to invalidate for
	// WRInvalidate. WRReadInv ignores it (it invalidates Local.STag).
	InvalidateSTag STag
	// Imm is the 8 bytes of Immediate Data (WRImmediate*, WRWriteImm).
	Imm uint64

	// Atomic operands (RFC 7306 §5.1): Add or Swap data and mask, compare
	// data and mask. A zero AddMask is a plain 64-bit add; for an unmasked
	// Compare-and-Swap set CompareMask and SwapMask to all ones.
	AddSwap, AddSwapMask, Compare, CompareMask uint64

	Bind    *BindMW
	FastReg *FastReg
}

// RecvWR is a work request for a receive queue.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// BindMW binds a memory window to a range of a memory region (draft §7.10.2).
type BindMW struct {
	MW        STag // the window's index and its new key
	MR        STag // the region (index + current key)
	ZeroBased bool
	VA        uint64 // first byte of the window as a TO of the region (VA-based regions)
	Len       uint64
	Access    Access // RemoteRead and/or RemoteWrite (RemoteAtomic allowed)
}

// FastReg registers memory under an STag previously allocated with
// AllocateMRSTag, in the Invalid state (draft §7.3.2.5).
type FastReg struct {
	STag      STag // index + new key
	Mem       Memory
	ZeroBased bool
	VA        uint64 // TO of the first byte for VA-based regions
	Access    Access
}

// Status is a work completion status (draft §9.5.2, Fig. 36).
type Status uint8

const (
	StatusSuccess Status = iota
	StatusFlushed
	StatusInvalidWQE
	StatusLocalQPCatastrophic
	StatusRemoteTermination
	StatusInvalidSTag
	StatusBaseBounds
	StatusAccessViolation
	StatusInvalidPD
	StatusWrap
	StatusInvalidateFailed // STag to invalidate had invalid PD or access rights
	StatusZeroORD
	StatusNotPrivileged
	StatusSTagNotInvalid
	StatusInvalidPageSize
	StatusInvalidBufferSize
	StatusInvalidPBLEntry
	StatusInvalidFBO
	StatusInvalidLength
	StatusInvalidAccessRights
	StatusPBLTooLong
	StatusInvalidVA
	StatusInvalidRegion
	StatusInvalidWindow
	StatusInvalidTotalLength
	StatusMRNotValid
)

var statusNames = [...]string{
	StatusSuccess: "success", StatusFlushed: "flushed", StatusInvalidWQE: "invalid WQE",
	StatusLocalQPCatastrophic: "local QP catastrophic error", StatusRemoteTermination: "remote termination error",
	StatusInvalidSTag: "invalid STag", StatusBaseBounds: "base and bounds violation",
	StatusAccessViolation: "access violation", StatusInvalidPD: "invalid PD ID", StatusWrap: "wrap error",
	StatusInvalidateFailed: "STag to invalidate had invalid PD or access rights",
	StatusZeroORD:          "zero RDMA read resources", StatusNotPrivileged: "QP not in privileged mode",
	StatusSTagNotInvalid: "STag not in invalid state", StatusInvalidPageSize: "invalid page size",
	StatusInvalidBufferSize: "invalid physical buffer size", StatusInvalidPBLEntry: "invalid physical buffer list entry",
	StatusInvalidFBO: "invalid FBO", StatusInvalidLength: "invalid length",
	StatusInvalidAccessRights: "invalid access rights specified", StatusPBLTooLong: "physical buffer list too long",
	StatusInvalidVA: "invalid virtual address", StatusInvalidRegion: "invalid region",
	StatusInvalidWindow: "invalid window", StatusInvalidTotalLength: "invalid total length",
	StatusMRNotValid: "MR not in valid state",
}

func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// WC is a work completion (draft §9.3.2.1). Fields other than ID, Op, Status
// and QPID are meaningful only on success.
type WC struct {
	ID     uint64
	Op     WROp
	Status Status
	QPID   uint32
	// Bytes is the length of the received message (receive completions).
	Bytes uint32
	// Invalidated is the STag a Send with Invalidate named (HasInvalidated).
	Invalidated    STag
	HasInvalidated bool
	// Imm is the Immediate Data of a receive consumed by an Immediate Data
	// message (HasImm).
	Imm       uint64
	HasImm    bool
	Solicited bool // the message carried the Solicited Event flag
}

// Err returns nil for a successful completion, else an error naming the
// status.
func (wc *WC) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{WC: *wc}
}

// CompletionError is a failed work completion as an error.
type CompletionError struct{ WC WC }

func (e *CompletionError) Error() string {
	return fmt.Sprintf("rnic: %s WR %d on QP %d: %s", e.WC.Op, e.WC.ID, e.WC.QPID, e.WC.Status)
}
