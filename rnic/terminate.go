package rnic

import (
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// TerminateMsg is a decoded Terminate message: its Layer/EType/Code, the
// M/D/R flags and the echoed DDP and RDMAP headers (RFC 5040 §4.8).
type TerminateMsg = rdmap.TerminateFields

// localCatastrophic is the Terminate for local errors not tied to an inbound
// segment: RDMAP / Local Catastrophic Error, no echoed headers (draft
// Fig. 12, 23: code 0x0000).
var localCatastrophic = rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}}
