package rdmap

import (
	"fmt"

	"github.com/rnic-dev/rnic/rnic/term"
)

// RDMAP versions (the RV field, RFC 5040 §4.1). Version is the one this
// package sends; VersionRDMAC is also valid on receive (see ValidVersion).
const (
	Version      = 1 // RV 01b: RFC 5040
	VersionRDMAC = 0 // RV 00b: the RDMA Consortium's RDMAP
)

// Opcode is the 4-bit RDMA message opcode of the RDMAP control byte.
type Opcode uint8

// RFC 5040 Figure 4 and RFC 7306 Figure 2.
const (
	OpWrite          Opcode = 0x0
	OpReadRequest    Opcode = 0x1
	OpReadResponse   Opcode = 0x2
	OpSend           Opcode = 0x3
	OpSendInv        Opcode = 0x4
	OpSendSE         Opcode = 0x5
	OpSendSEInv      Opcode = 0x6
	OpTerminate      Opcode = 0x7
	OpImmediate      Opcode = 0x8 // RFC 7306
	OpImmediateSE    Opcode = 0x9 // RFC 7306
	OpAtomicRequest  Opcode = 0xA // RFC 7306
	OpAtomicResponse Opcode = 0xB // RFC 7306
	maxOpcode               = OpAtomicResponse
)

// Untagged queue numbers (RFC 5040 §3.1, RFC 7306 §10.3).
const (
	QNSend           = 0 // Send variants and Immediate Data
	QNReadRequest    = 1 // RDMA Read Requests and Atomic Requests
	QNTerminate      = 2
	QNAtomicResponse = 3
	// QNNone is what Opcode.QN returns for tagged and unknown opcodes.
	QNNone = ^uint32(0)
)

var opNames = [...]string{
	OpWrite: "RDMA Write", OpReadRequest: "RDMA Read Request", OpReadResponse: "RDMA Read Response",
	OpSend: "Send", OpSendInv: "Send with Invalidate", OpSendSE: "Send with SE",
	OpSendSEInv: "Send with SE and Invalidate", OpTerminate: "Terminate",
	OpImmediate: "Immediate Data", OpImmediateSE: "Immediate Data with SE",
	OpAtomicRequest: "Atomic Request", OpAtomicResponse: "Atomic Response",
}

// Valid reports whether o is an assigned opcode (0x0..0xB).
func (o Opcode) Valid() bool { return o <= maxOpcode }

func (o Opcode) String() string {
	if o.Valid() {
		return opNames[o]
	}
	return fmt.Sprintf("opcode(0x%X)", uint8(o))
}

// Tagged reports whether the message uses the tagged buffer model (RDMA
// Write and RDMA Read Response).
func (o Opcode) Tagged() bool { return o == OpWrite || o == OpReadResponse }

// QN returns the untagged queue number the message must use, or QNNone for
// tagged and unassigned opcodes.
func (o Opcode) QN() uint32 {
	switch o {
	case OpSend, OpSendInv, OpSendSE, OpSendSEInv, OpImmediate, OpImmediateSE:
		return QNSend
	case OpReadRequest, OpAtomicRequest:
		return QNReadRequest
	case OpTerminate:
		return QNTerminate
	case OpAtomicResponse:
		return QNAtomicResponse
	}
	return QNNone
}

// HasInvalidate reports whether the message carries an Invalidate STag.
func (o Opcode) HasInvalidate() bool { return o == OpSendInv || o == OpSendSEInv }

// Solicited reports whether the message asks for a Solicited Event.
func (o Opcode) Solicited() bool { return o == OpSendSE || o == OpSendSEInv || o == OpImmediateSE }

// Atomic reports whether the message is an RFC 7306 atomic message.
func (o Opcode) Atomic() bool { return o == OpAtomicRequest || o == OpAtomicResponse }

// Bits of the RDMAP control byte (ULPDU byte 1).
const (
	maskRV     = 0xC0
	maskRsv    = 0x30
	maskOpcode = 0x0F
)

// Ctrl returns the RDMAP control byte for op: RV = 01b, Rsv = 0.
func Ctrl(op Opcode) byte { return Version<<6 | byte(op)&maskOpcode }

// CtrlVersion returns the RDMAP version (RV) of control byte b.
func CtrlVersion(b byte) uint8 { return (b & maskRV) >> 6 }

// ValidVersion reports whether RV rv is valid for a message with opcode op.
// RFC 5040 §4.1: "01b for an RNIC that complies with this RDMA protocol
// specification. 00b for an RNIC that complies with the RDMA Consortium's
// RDMA protocol specification. Both version numbers are valid." RFC 7306
// §4.1: "All RDMA Messages defined in this specification MUST have: The RDMA
// Version (RV) field: 01b", so its opcodes (0x8..0xB) need 01b. 10b and 11b
// are never valid. For an unassigned opcode only 10b and 11b are refused:
// the opcode check reports the rest.
func ValidVersion(rv uint8, op Opcode) bool {
	switch rv {
	case Version:
		return true
	case VersionRDMAC:
		return op < OpImmediate || op > OpAtomicResponse
	}
	return false
}

// ParseCtrl decodes an RDMAP control byte, checking in the order of RFC
// 5040 §7.2 ("2. The RDMA OpCode MUST be valid. 3. The RDMA Version MUST
// be valid."): an unassigned opcode (0xC..0xF) is Unexpected OpCode
// (0/2/0x06), then an RV that ValidVersion refuses (10b, 11b, or 00b on an
// RFC 7306 opcode) is RDMA / Remote Operation / Invalid RDMAP Version
// (0/2/0x05): the opcode before the version, in RFC 5040 §7.2's order. The
// Rsv bits are ignored, as RFC 5040 §4.1 requires. CheckCtrl adds the
// opcode's placement checks.
func ParseCtrl(b byte) (Opcode, error) {
	op := Opcode(b & maskOpcode)
	if !op.Valid() {
		return 0, term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"unassigned RDMAP opcode 0x%X", uint8(op))
	}
	if err := checkVersion(b, op); err != nil {
		return 0, err
	}
	return op, nil
}

func checkVersion(b byte, op Opcode) error {
	if rv := CtrlVersion(b); !ValidVersion(rv, op) {
		return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpInvalidVersion,
			"RDMAP version %d in control byte 0x%02X, valid: 1, and 0 for RFC 5040 opcodes", rv, b)
	}
	return nil
}

// CheckCtrl runs steps 2 and 3 of RFC 5040 §7.2 (RFC 7306 §8.2) on the
// RDMAP control byte b of a segment whose DDP fields (step 1) passed: the
// opcode must be valid, which includes its buffer model and queue number
// (CheckPlacement: a tagged Send, an untagged Write, a Send on QN 1 are
// Unexpected OpCode 0/2/0x06), and only then the RDMA Version (0/2/0x05).
// A segment with both a bad opcode and a bad version reports the opcode.
func CheckCtrl(b byte, tagged bool, qn uint32, atomics bool) (Opcode, error) {
	op := Opcode(b & maskOpcode)
	if err := CheckPlacement(op, tagged, qn, atomics); err != nil {
		return 0, err
	}
	if err := checkVersion(b, op); err != nil {
		return 0, err
	}
	return op, nil
}

// CheckPlacement checks an opcode against the DDP buffer model and queue
// number it arrived with (RFC 5040 Figure 4, RFC 7306 Figure 2). qn is
// ignored for tagged segments. With atomics false, the RFC 7306 atomic
// opcodes are unexpected and QN 3 does not exist.
//
// Errors: an untagged QN that does not exist on the stream (QN > 2, or > 3
// with atomics) is DDP / Untagged / Invalid QN (1/2/0x01), because DDP
// validates its fields before RDMAP looks at the opcode (RFC 5040 §7.2);
// every other mismatch (tagged Send, untagged Write, a Send on QN 1, an
// unsupported or unassigned opcode) is RDMA / Remote Operation / Unexpected
// OpCode (0/2/0x06).
func CheckPlacement(op Opcode, tagged bool, qn uint32, atomics bool) error {
	numQN := uint32(3)
	if atomics {
		numQN = 4
	}
	if !tagged && qn >= numQN {
		return term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN,
			"QN %d, valid QNs are 0..%d", qn, numQN-1)
	}
	switch {
	case !op.Valid():
		return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"unassigned RDMAP opcode 0x%X", uint8(op))
	case op.Atomic() && !atomics:
		return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"%v received but atomics are not enabled", op)
	case op.Tagged() != tagged:
		model := "untagged"
		if tagged {
			model = "tagged"
		}
		return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"%v in a %s DDP segment", op, model)
	case !tagged && op.QN() != qn:
		return term.Errorf(term.LayerRDMAP, term.RDMARemoteOperation, term.OpUnexpectedOpcode,
			"%v on QN %d, it belongs on QN %d", op, qn, op.QN())
	}
	return nil
}
