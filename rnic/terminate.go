package rnic

import "github.com/rnic-dev/rnic/rnic/rdmap"

// TerminateMsg is a decoded Terminate message: its Layer/EType/Code, the
// M/D/R flags and the echoed DDP and RDMAP headers (RFC 5040 §4.8).
type TerminateMsg = rdmap.TerminateFields
