// Package rdmap encodes and decodes the RDMA Protocol (RFC 5040) messages
// and the RFC 7306 extensions (Atomic operations and Immediate Data) that
// travel in DDP segments (package ddp), and builds and parses Terminate
// messages.
//
// # Layout
//
// The RDMAP control byte is the DDP RsvdULP octet (ULPDU byte 1):
// RV (0xC0, 01b, or 00b on receive) | Rsv (0x30) | Opcode (0x0F). Opcodes, buffer
// models and queue numbers (RFC 5040 Figure 4, RFC 7306 Figure 2):
//
//	0x0 RDMA Write          tagged
//	0x1 RDMA Read Request   QN 1, 28-byte Read Request header
//	0x2 RDMA Read Response  tagged
//	0x3..0x6 Send, Send with Invalidate, Send with SE, Send with SE and
//	    Invalidate          QN 0 (the Invalidate variants carry the STag in
//	                        DDP RsvdULP octets 2..5)
//	0x7 Terminate           QN 2, 4..52-byte Terminate header
//	0x8, 0x9 Immediate Data (with SE)   QN 0, exactly 8 bytes
//	0xA Atomic Request      QN 1, 52-byte header
//	0xB Atomic Response     QN 3, 12-byte header
//
// The fixed headers that follow the DDP header are views (ReadRequest,
// AtomicRequest, AtomicResponse, Immediate) with accessors, setters and an
// Encode from a fields struct; they neither copy nor allocate. All fields
// are big-endian. The Terminate header is variable (RFC 5040 §4.8):
// control word Layer|EType, Error Code, M|D|R, reserved; then, when
// flagged, the DDP Segment Length, the offending DDP header (14 or 18 bytes
// by its own T bit) and, for an RDMA Read Request only, its 28-byte header.
//
// # Strictness
//
// Every decoder checks what RFC 5040/7306 make checkable and returns a
// *term.Error carrying the Terminate the engine sends:
//
//	RV 10b or 11b, or 00b on an
//	RFC 7306 opcode                  0/2/0x05 Invalid RDMAP version
//	opcode 0xC..0xF, opcode vs T bit
//	or QN, atomics not enabled,
//	unsupported AOpCode              0/2/0x06 Unexpected OpCode
//	QN beyond 2 (3 with atomics)     1/2/0x01 Invalid QN (a DDP check,
//	                                 which RFC 5040 §7.2 orders first)
//	wrong Read Request, Atomic or
//	Immediate length                 0/2/0xFF Unspecified (no RFC code)
//
// The order is RFC 5040 §7.2's: the DDP segment fields first (package ddp
// and the QN check in CheckPlacement), then the opcode with its buffer model
// and queue number, then the RDMA version (CheckCtrl), so a segment with a
// bad opcode and a bad version reports Unexpected OpCode.
//
// Reserved fields are not checked on receive, because the RFCs say so: the
// RDMAP Rsv bits and the Invalidate STag of messages other than Send with
// Invalidate (RFC 5040 §4.1), the 13 reserved Terminate bits (§4.8), the 28
// reserved bits of the Atomic Request and the Compare fields of a FetchAdd
// (RFC 7306 §5.2.1). Where the RFC text leaves a choice, the choice made is
// listed below.
//
// Version: RFC 5040 §4.1 calls RV 00b (RDMA Consortium) valid too: "Both
// version numbers are valid". This package sends 01b and accepts 00b and
// 01b on the RFC 5040 messages; RFC 7306 §4.1 requires 01b on its
// messages, so 00b is refused there.
//
// Terminate: ParseTerminate accepts the 4-byte form and zero-filled longer
// forms, sizes the echoed DDP header by its own T bit and expects RDMA
// header bytes only when R is set, the echoed message is a Read Request and
// the bytes are there (siw sets R without them for Send with Invalidate).
// TerminateFor applies Figure 10: no headers for LLP and RDMA Local
// Catastrophic errors, the DDP header for every DDP error (Invalid DDP
// Version included, zero-padded if the segment cut it short) and for Remote
// Operation errors, and the Read Request header too for Remote Protection
// errors on a Read Request. RFC 7306 §8.1
// echoes no RDMA header for atomics, so none is echoed for them.
//
// STags, bounds, access rights, alignment and outstanding-request matching
// are the engine's checks; zero-length Read Requests, Writes and Read
// Responses must skip the STag checks (RFC 5040 §5.1, §5.2).
//
// # Atomics
//
// FetchAdd and CmpSwap compute the RFC 7306 §5.1 masked arithmetic on a
// word's value; applying them atomically to memory is the engine's job.
package rdmap
