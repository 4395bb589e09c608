package nvmf

import "fmt"

// Status is an NVMe completion status without the phase bit: the Status
// Code Type in bits 10:8, the Status Code in bits 7:0, More in bit 13 and
// Do Not Retry in bit 14 (NVMe Base 2.0 §4.2.3; the CQE carries it shifted
// left by one, bit 0 being the phase tag).
type Status uint16

// Status codes the target returns. Generic (SCT 0), command specific (SCT
// 1), media and data integrity (SCT 2); NVMe over Fabrics 1.1 §3.3.1 for
// the Connect codes.
const (
	StatusSuccess           Status = 0x000
	StatusInvalidOpcode     Status = 0x001
	StatusInvalidField      Status = 0x002
	StatusDataXferError     Status = 0x004
	StatusInternal          Status = 0x006
	StatusAbortRequested    Status = 0x007
	StatusInvalidNS         Status = 0x00b
	StatusCmdSeqError       Status = 0x00c
	StatusSGLInvalidLast    Status = 0x00d
	StatusSGLInvalidCount   Status = 0x00e
	StatusSGLInvalidData    Status = 0x00f
	StatusSGLInvalidType    Status = 0x011
	StatusSGLInvalidOffset  Status = 0x016
	StatusSGLInvalidSubtype Status = 0x017
	StatusNSWriteProtected  Status = 0x020
	StatusLBARange          Status = 0x080
	StatusCapExceeded       Status = 0x081
	StatusReservationConf   Status = 0x083

	StatusInvalidQID      Status = 0x101
	StatusAsyncLimit      Status = 0x105
	StatusInvalidLogPage  Status = 0x109
	StatusFeatNotSaveable Status = 0x10d
	StatusFeatNotChange   Status = 0x10e

	StatusConnectFormat       Status = 0x180
	StatusConnectCtrlBusy     Status = 0x181
	StatusConnectInvalidParam Status = 0x182
	StatusConnectInvalidHost  Status = 0x184

	StatusWriteFault Status = 0x280
	StatusReadError  Status = 0x281
	StatusGuardCheck Status = 0x282

	// StatusMore and StatusDNR are flags: more status information in the
	// Error log page; do not retry the command.
	StatusMore Status = 0x2000
	StatusDNR  Status = 0x4000
)

// Code is the status without the More and DNR flags.
func (s Status) Code() Status { return s &^ (StatusMore | StatusDNR) }

// DNR reports the Do Not Retry flag.
func (s Status) DNR() bool { return s&StatusDNR != 0 }

var statusNames = map[Status]string{
	StatusSuccess: "success", StatusInvalidOpcode: "invalid opcode", StatusInvalidField: "invalid field in command",
	StatusDataXferError: "data transfer error", StatusInternal: "internal error",
	StatusAbortRequested: "command abort requested", StatusInvalidNS: "invalid namespace or format",
	StatusCmdSeqError: "command sequence error", StatusSGLInvalidLast: "invalid SGL last segment descriptor",
	StatusSGLInvalidCount: "invalid number of SGL descriptors", StatusSGLInvalidData: "data SGL length invalid",
	StatusSGLInvalidType: "SGL descriptor type invalid", StatusSGLInvalidOffset: "SGL offset invalid",
	StatusSGLInvalidSubtype: "SGL descriptor subtype invalid", StatusNSWriteProtected: "namespace is write protected",
	StatusLBARange: "LBA out of range", StatusCapExceeded: "capacity exceeded",
	StatusReservationConf: "reservation conflict", StatusInvalidQID: "invalid queue identifier",
	StatusAsyncLimit: "asynchronous event request limit exceeded", StatusInvalidLogPage: "invalid log page",
	StatusFeatNotSaveable: "feature identifier not saveable", StatusFeatNotChange: "feature not changeable",
	StatusConnectFormat: "incompatible format", StatusConnectCtrlBusy: "controller busy",
	StatusConnectInvalidParam: "connect invalid parameters", StatusConnectInvalidHost: "connect invalid host",
	StatusWriteFault: "write fault", StatusReadError: "unrecovered read error", StatusGuardCheck: "end-to-end guard check error",
}

func (s Status) String() string {
	n, ok := statusNames[s.Code()]
	if !ok {
		n = fmt.Sprintf("status 0x%03x", uint16(s.Code()))
	}
	if s.DNR() {
		n += " (DNR)"
	}
	return n
}

// StatusError is a command's failure: the status for its completion, the
// completion's result field (for Connect's invalid-parameter pointer) and
// what went wrong, for the log.
type StatusError struct {
	Status Status
	Result uint64
	Reason string
}

func (e *StatusError) Error() string {
	if e.Reason == "" {
		return "nvmf: " + e.Status.String()
	}
	return "nvmf: " + e.Status.String() + ": " + e.Reason
}

// fail returns a *StatusError with DNR set (the host gains nothing by
// retrying a malformed command).
func fail(s Status, format string, a ...any) *StatusError {
	return &StatusError{Status: s | StatusDNR, Reason: fmt.Sprintf(format, a...)}
}
