package linuxvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// mpaRR is an MPA Request or Reply frame (RFC 5044 §7.1) as a byte slice,
// decoded here only to check what the VM's siw put on the wire. The real
// codec lives in rnic/mpa.
type mpaRR []byte

const mpaRRHeaderLen = 20

var errShortMPA = errors.New("mpa request/reply: short frame")

func parseMPARR(b []byte) (mpaRR, error) {
	if len(b) < mpaRRHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes", errShortMPA, len(b))
	}
	f := mpaRR(b)
	if n := mpaRRHeaderLen + int(f.PDLength()); len(b) < n {
		return nil, fmt.Errorf("%w: %d bytes, want %d", errShortMPA, len(b), n)
	}
	return f[:mpaRRHeaderLen+int(f.PDLength())], nil
}

func (f mpaRR) Key() string         { return string(f[:16]) }
func (f mpaRR) Markers() bool       { return f[16]&0x80 != 0 }
func (f mpaRR) CRC() bool           { return f[16]&0x40 != 0 }
func (f mpaRR) Reject() bool        { return f[16]&0x20 != 0 }
func (f mpaRR) Enhanced() bool      { return f[16]&0x10 != 0 }
func (f mpaRR) Rev() uint8          { return f[17] }
func (f mpaRR) PDLength() uint16    { return binary.BigEndian.Uint16(f[18:20]) }
func (f mpaRR) PrivateData() []byte { return f[mpaRRHeaderLen:] }

// IRDORD returns the RFC 6581 IRD/ORD words when the frame carries them.
func (f mpaRR) IRDORD() (ird, ord uint16, ok bool) {
	pd := f.PrivateData()
	if !f.Enhanced() || len(pd) < 4 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(pd[0:2]), binary.BigEndian.Uint16(pd[2:4]), true
}

func FuzzParseMPARR(f *testing.F) {
	f.Add([]byte("MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01"))
	f.Add([]byte("MPA ID Rep Frame\x50\x01\x00\x00"))
	f.Add([]byte("MPA ID Req Frame\x10\x02\xff\xff"))
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMPARR(b)
		if err != nil {
			if !errors.Is(err, errShortMPA) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(m) != mpaRRHeaderLen+int(m.PDLength()) {
			t.Fatalf("frame length %d, PD_Length %d", len(m), m.PDLength())
		}
		_, _ = m.Key(), m.Rev()
		m.IRDORD()
	})
}

func TestParseMPARR(t *testing.T) {
	m, err := parseMPARR([]byte("MPA ID Req Frame\x10\x02\x00\x04\x80\x01\x40\x02extra"))
	if err != nil {
		t.Fatal(err)
	}
	ird, ord, ok := m.IRDORD()
	if m.Key() != "MPA ID Req Frame" || !m.Enhanced() || m.CRC() || m.Rev() != 2 || !ok || ird != 0x8001 || ord != 0x4002 {
		t.Fatalf("got key %q enhanced %v crc %v rev %d ird/ord %#x/%#x %v", m.Key(), m.Enhanced(), m.CRC(), m.Rev(), ird, ord, ok)
	}
	if _, err := parseMPARR([]byte("MPA ID Req Frame\x10\x02\x00\x08\x00")); !errors.Is(err, errShortMPA) {
		t.Fatalf("truncated private data: got %v", err)
	}
}

// rdmapOps names the RDMAP opcodes (RFC 5040 §4.3, RFC 7306 §4) in an
// fpduSummary.
var rdmapOps = map[byte]string{
	0x0: "Write", 0x1: "ReadReq", 0x2: "ReadResp", 0x3: "Send", 0x4: "SendInv",
	0x5: "SendSE", 0x6: "SendSEInv", 0x7: "Terminate", 0x8: "WriteImm", 0x9: "SendImm",
	0xa: "SendImmSE", 0xb: "AtomicReq", 0xc: "AtomicResp",
}

// fpduSummary lists the FPDUs of a recorded stream that starts after the
// MPA Request or Reply (no markers), one "opcode/length" per FPDU, L
// marking a DDP message's last segment; it stops at the first FPDU the
// recording cut. Every FPDU carries the 4 bytes of the CRC field, zero
// where CRCs were not negotiated (RFC 5044 §4.4). Diagnostics for a failed
// exchange: which side sent what before the stall.
func fpduSummary(b []byte) string {
	var out []string
	for len(b) >= 4 {
		ulpdu := int(binary.BigEndian.Uint16(b))
		n := 2 + ulpdu + (-(2 + ulpdu))&3 + 4
		op, ok := rdmapOps[b[3]&0x0f]
		if !ok {
			op = fmt.Sprintf("op%#x", b[3]&0x0f)
		}
		if b[2]&0x40 != 0 {
			op += "(L)"
		}
		if len(b) < n {
			out = append(out, fmt.Sprintf("%s/%d (cut)", op, ulpdu))
			break
		}
		out = append(out, fmt.Sprintf("%s/%d", op, ulpdu))
		b = b[n:]
	}
	if len(b) > 0 && len(b) < 4 {
		out = append(out, fmt.Sprintf("%d bytes", len(b)))
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, " ")
}

func TestFPDUSummary(t *testing.T) {
	// A Send of 4 bytes (untagged, last) with CRC, then a Read Request
	// header cut short.
	send := []byte{0x00, 0x12, 0x41, 0x43}
	send = append(send, make([]byte, 0x12-2+4)...) // rest of ULPDU, pad 0, CRC
	got := fpduSummary(append(send, 0x00, 0x2c, 0x41, 0x41, 0x00))
	if want := "Send(L)/18 ReadReq(L)/44 (cut)"; got != want {
		t.Fatalf("fpduSummary = %q, want %q", got, want)
	}
	if got := fpduSummary(nil); got != "nothing" {
		t.Fatalf("fpduSummary(nil) = %q", got)
	}
	// A 1-byte ULPDU takes 1 byte of pad, then the CRC field.
	if got := fpduSummary([]byte{0x00, 0x01, 0x40, 0x40, 0, 0, 0, 0, 0, 0}); got != "Write(L)/1 2 bytes" {
		t.Fatalf("fpduSummary = %q", got)
	}
}
