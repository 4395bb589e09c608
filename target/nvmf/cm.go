package nvmf

import (
	"encoding/binary"
	"fmt"
)

// The RDMA CM private data of NVMe/RDMA (NVMe over Fabrics 1.1 §7.3.2;
// Linux include/linux/nvme-rdma.h): the host's request rides in the MPA
// Request's private data, the controller's reply in the MPA Reply's, and a
// refusal in a rejecting MPA Reply. Little-endian.

// Sizes of the private data structures.
const (
	CMRequestLen = 32
	CMReplyLen   = 32
	CMRejectLen  = 4
)

// CMRecFmt is the only record format (1.0, value 0).
const CMRecFmt = 0

// MaxQueueSize is the largest I/O queue an NVMe/RDMA host asks for
// (NVME_RDMA_MAX_QUEUE_SIZE); AdminQueueSize is the admin queue's size
// (NVME_AQ_DEPTH), the largest an admin queue may be.
const (
	MaxQueueSize   = 128
	AdminQueueSize = 32
)

// CMRejectStatus is the status of a rejected connection (NVMe over Fabrics
// 1.1 Figure 53).
type CMRejectStatus uint16

const (
	CMRejectInvalidLen     CMRejectStatus = 1
	CMRejectInvalidRecFmt  CMRejectStatus = 2
	CMRejectInvalidQID     CMRejectStatus = 3
	CMRejectInvalidHSQSize CMRejectStatus = 4
	CMRejectInvalidHRQSize CMRejectStatus = 5
	CMRejectNoResources    CMRejectStatus = 6
	CMRejectInvalidIRD     CMRejectStatus = 7
	CMRejectInvalidORD     CMRejectStatus = 8
)

var cmRejectNames = [...]string{"", "invalid private data length", "invalid record format", "invalid queue ID",
	"invalid host SQ size", "invalid host RQ size", "no resources", "invalid IRD", "invalid ORD"}

func (s CMRejectStatus) String() string {
	if int(s) < len(cmRejectNames) && s != 0 {
		return cmRejectNames[s]
	}
	return fmt.Sprintf("reject status %d", uint16(s))
}

// CMRequest is the host's private data: record format, queue ID, host
// receive queue size and host submission queue size (0-based).
type CMRequest []byte

func (r CMRequest) RecFmt() uint16  { return binary.LittleEndian.Uint16(r[0:]) }
func (r CMRequest) QID() uint16     { return binary.LittleEndian.Uint16(r[2:]) }
func (r CMRequest) HRQSize() uint16 { return binary.LittleEndian.Uint16(r[4:]) }
func (r CMRequest) HSQSize() uint16 { return binary.LittleEndian.Uint16(r[6:]) }

// CMRequestFields are the fields of a request to encode.
type CMRequestFields struct{ RecFmt, QID, HRQSize, HSQSize uint16 }

// Encode writes f into r (32 bytes).
func (r CMRequest) Encode(f *CMRequestFields) {
	clear(r[:CMRequestLen])
	binary.LittleEndian.PutUint16(r[0:], f.RecFmt)
	binary.LittleEndian.PutUint16(r[2:], f.QID)
	binary.LittleEndian.PutUint16(r[4:], f.HRQSize)
	binary.LittleEndian.PutUint16(r[6:], f.HSQSize)
}

// CMRequestError is a request refused: the reject status to send and why.
type CMRequestError struct {
	Status CMRejectStatus
	Reason string
}

func (e *CMRequestError) Error() string {
	return "nvmf: connection request: " + e.Status.String() + ": " + e.Reason
}

// ParseCMRequest checks a host's private data as Linux nvmet does
// (drivers/nvme/target/rdma.c, nvmet_rdma_parse_cm_connect_req): at least
// 32 bytes, record format 0, a submission queue of 1 to MaxQueueSize
// entries (AdminQueueSize for the admin queue, qid 0), and a receive queue
// at least as deep as the submission queue (the host must take a
// completion for every command it may have outstanding). Bytes past the 32
// are ignored (later versions append fields).
func ParseCMRequest(pd []byte) (CMRequest, error) {
	if len(pd) < CMRequestLen {
		return nil, &CMRequestError{CMRejectInvalidLen, fmt.Sprintf("%d bytes of private data, want %d", len(pd), CMRequestLen)}
	}
	r := CMRequest(pd[:CMRequestLen])
	if r.RecFmt() != CMRecFmt {
		return nil, &CMRequestError{CMRejectInvalidRecFmt, fmt.Sprintf("record format %d", r.RecFmt())}
	}
	sq := int(r.HSQSize()) + 1
	limit := MaxQueueSize
	if r.QID() == 0 {
		limit = AdminQueueSize
	}
	if sq < 2 || sq > limit {
		return nil, &CMRequestError{CMRejectInvalidHSQSize, fmt.Sprintf("submission queue of %d entries on queue %d, want 2-%d",
			sq, r.QID(), limit)}
	}
	if int(r.HRQSize()) < sq {
		return nil, &CMRequestError{CMRejectInvalidHRQSize, fmt.Sprintf("receive queue of %d entries for a submission queue of %d",
			r.HRQSize(), sq)}
	}
	return r, nil
}

// IsNVMeRequest reports whether a connection request on a port shared with
// the native block protocol is for NVMe/RDMA: it carries private data (an
// NVMe/RDMA host always sends its CM request; a native initiator sends
// none). Requests that carry private data are then checked by
// ParseCMRequest and refused with the CM reject status if malformed.
func IsNVMeRequest(pd []byte) bool { return len(pd) > 0 }

// CMReply is the controller's private data: record format and controller
// receive queue size.
type CMReply []byte

func (r CMReply) RecFmt() uint16  { return binary.LittleEndian.Uint16(r[0:]) }
func (r CMReply) CRQSize() uint16 { return binary.LittleEndian.Uint16(r[2:]) }

// CMReplyFields are the fields of a reply to encode.
type CMReplyFields struct{ RecFmt, CRQSize uint16 }

// Encode writes f into r (32 bytes).
func (r CMReply) Encode(f *CMReplyFields) {
	clear(r[:CMReplyLen])
	binary.LittleEndian.PutUint16(r[0:], f.RecFmt)
	binary.LittleEndian.PutUint16(r[2:], f.CRQSize)
}

// CMReject is the private data of a refused connection.
type CMReject []byte

func (r CMReject) RecFmt() uint16         { return binary.LittleEndian.Uint16(r[0:]) }
func (r CMReject) Status() CMRejectStatus { return CMRejectStatus(binary.LittleEndian.Uint16(r[2:])) }

// CMRejectFields are the fields of a reject to encode.
type CMRejectFields struct {
	RecFmt uint16
	Status CMRejectStatus
}

// Encode writes f into r (4 bytes).
func (r CMReject) Encode(f *CMRejectFields) {
	binary.LittleEndian.PutUint16(r[0:], f.RecFmt)
	binary.LittleEndian.PutUint16(r[2:], uint16(f.Status))
}
