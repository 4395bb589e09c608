// Package ddp encodes and decodes Direct Data Placement (RFC 5041) segment
// headers as RDMAP (RFC 5040, RFC 7306) uses them, and keeps the per-queue
// message sequence state of the untagged buffer model.
//
// # Layout
//
// A DDP segment is the ULPDU of one MPA FPDU. Offsets below are within the
// ULPDU (after MPA's 2-byte ULPDU_LENGTH); all fields are big-endian.
//
//	byte 0       DDP control: T (0x80) | L (0x40) | Rsvd (0x3C) | DV (0x03)
//	byte 1       RsvdULP, the RDMAP control byte (RV | Rsv | Opcode)
//
//	Tagged (T=1), TaggedHeaderLen = 14 bytes:
//	2..5         STag (data sink)
//	6..13        TO, the tagged offset of this segment's first payload byte
//
//	Untagged (T=0), UntaggedHeaderLen = 18 bytes:
//	2..5         RsvdULP octets 2..5 (RDMAP's Invalidate STag)
//	6..9         QN, queue number
//	10..13       MSN, message sequence number (first message on a QN is 1,
//	             0xFFFFFFFF is followed by 0)
//	14..17       MO, offset of this segment's payload in the message
//
// Tagged and Untagged are views: named byte slices with accessors and
// setters that neither copy nor allocate. Encode writes a whole header from
// a fields struct, with T and DV set and the reserved bits zero.
//
// # Strictness
//
// ParseTagged and ParseUntagged check the length, the T bit and the DDP
// version (DV must be 01b, RFC 5041); a failure is a *term.Error with the
// Terminate cause the engine sends: DDP / Tagged Buffer / Invalid DDP
// Version (1/1/0x04) or DDP / Untagged Buffer / Invalid DDP Version
// (1/2/0x06). The reserved bits 0x3C of the control byte are not checked on
// receive: RFC 5041 says they are set to zero on transmit and not checked on
// receive.
//
// RxQueues checks the untagged sequence rules of one direction of one
// stream: the QN is valid (1/2/0x01), the MSN is the one expected on that
// QN (1/2/0x03) and the MO equals the bytes already received of the current
// message (1/2/0x04). Over a single in-order TCP byte stream this exact match
// is the strictest reading of RFC 5041's "MSN in range" and "MO inside the
// buffer" rules. Whether a buffer is posted (1/2/0x02)
// and whether the message fits it (1/2/0x05) are the engine's checks.
//
// Tagged segments are not checked against STags here: STag, bounds and
// access checks belong to the engine, which must skip them for zero-length
// tagged segments (zero-length RDMA Write, zero-length Read Response and the
// RFC 6581 zero-length RTR Write carry an STag that need not be valid).
//
// Nothing here panics on any input given to a Parse function; the view
// accessors expect a view of at least the header length, which ParseTagged
// and ParseUntagged guarantee.
package ddp
