// Package mpa implements Marker PDU Aligned framing (RFC 5044) with the RFC
// 6581 enhanced connection setup: the MPA Request/Reply frames exchanged
// when a connection starts, and the FPDU stream of full operation.
//
// # Request and Reply frames
//
//	0..15   key "MPA ID Req Frame" or "MPA ID Rep Frame"
//	16      flags: M 0x80 (markers wanted), C 0x40 (CRC wanted),
//	        R 0x20 (rejected, Reply only), 0x10 enhanced (rev 2), rest reserved
//	17      revision: 1 (RFC 5044) or 2 (RFC 6581)
//	18..19  PD_Length, big-endian, at most 512
//	20..    private data; with rev 2 and the 0x10 flag it begins with the
//	        4-byte IRD/ORD block (P2P|RTRSend|IRD, RTRWrite|RTRRead|ORD),
//	        which PD_Length counts
//
// The frames carry no CRC, pad or markers. ReadFrame reads exactly one
// frame's bytes so that the FPDU stream behind it stays unread.
//
// # FPDUs
//
// Writer frames every FPDU this module sends (AppendFPDU is one FPDU through
// it): many FPDUs into one batch for one write, each payload copied from
// where it lives and checksummed in the same pass. Reader parses them.
// Markers are read but never written: the engine does not ask for them and
// refuses a peer that requires them.
//
//	ULPDU_LENGTH (2, big-endian) | ULPDU | pad (0..3 zero bytes) | CRC32c (4)
//
// The pad makes 2 + ULPDU_LENGTH + pad a multiple of 4. The CRC32c
// (Castagnoli, package crc32c) covers the length, the ULPDU, the pad and any
// markers inside the FPDU, and is sent least significant byte first, unlike
// every other field. It is sent (as zeros) even when neither side asked for
// CRCs, and then not checked. When markers are in use, a 4-byte marker (16
// reserved bits, 16-bit FPDUPTR) sits at every 512th byte of the stream,
// counted from the first byte after the Request/Reply exchange; FPDUPTR is
// the distance back to the start of the FPDU the marker is in (0 when the
// FPDU begins with the marker).
//
// # Strictness
//
// ParseFrame and ReadFrame reject a wrong key (also a Reply where a Request
// is due and the reverse), revisions other than 1 and 2, PD_Length above 512
// and an enhanced frame without room for its IRD/ORD block, all as
// *term.Error LLP / MPA / Invalid MPA Request or Reply frame (2/0/0x04).
// They report the M, C and R flags without judging them: refusing markers
// or acting on a rejection is connection-manager policy. Reserved flag bits
// are ignored on receive and R is ignored in a Request, as RFC 5044 says.
//
// Reader rejects a ULPDU_LENGTH below 14 (no DDP header fits) or above the
// configured maximum, and a marker whose FPDUPTR does not point back to its
// FPDU, as LLP / MPA / 0x03, and a CRC mismatch as LLP / MPA / 0x02. It
// checks the CRC only at Finish, after the caller has consumed the ULPDU:
// the engine places payload while it is checksummed and acts on nothing
// before Finish succeeds. Pad bytes are covered by the CRC but their value
// is not checked. Errors are sticky, and no input makes a decoder panic
// (fuzzed by FuzzReader, FuzzParseFrame and FuzzParseIRDORD). The encoders
// trust their caller: Writer and AppendFPDU panic on a ULPDU over 65535
// bytes, which MULPDU-sized segmentation never produces, and on payload
// that does not match the length given to Begin.
//
// The frame and FPDU layouts follow Linux siw, cxgb4 and Wireshark's iWARP
// dissector (internal/wiretest has tshark decode what the encoders build).
// For markers, Wireshark and the OSC iWARP stack count FPDUPTR from the
// FPDU's first byte; for an FPDU that begins with a marker the Reader also
// accepts a pointer counted from the ULPDU_LENGTH field after it.
package mpa
