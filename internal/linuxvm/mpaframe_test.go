package linuxvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
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

// rdmapOps names the RDMAP opcodes (RFC 5040 Figure 4, RFC 7306 Figure 2)
// in an fpduSummary. rnic/rdmap has the same table; this package stays
// free of the engine's packages (internal/layers), as its codec does.
var rdmapOps = map[byte]string{
	opWrite: "Write", opReadReq: "ReadReq", opReadResp: "ReadResp", opSend: "Send", 0x4: "SendInv",
	0x5: "SendSE", 0x6: "SendSEInv", opTerminate: "Terminate", 0x8: "Immediate", 0x9: "ImmediateSE",
	0xa: "AtomicReq", 0xb: "AtomicResp",
}

// fpduSummary lists the FPDUs of a recorded stream that starts after the
// MPA Request or Reply (no markers), one "opcode/ULPDU length" per FPDU, L
// marking a DDP message's last segment, read and checked (CRCs with
// withCRC) by readFPDU and parseFPDU; it stops at an FPDU the recording
// cut. Diagnostics for a failed exchange: which side sent what before the
// stall.
func fpduSummary(b []byte, withCRC bool) string {
	r := bytes.NewReader(b)
	var out []string
	for r.Len() > 0 {
		left := r.Len()
		raw, err := readFPDU(r)
		if err != nil {
			out = append(out, fmt.Sprintf("%d bytes of a cut FPDU", left))
			break
		}
		s, err := parseFPDU(raw, withCRC)
		if err != nil {
			out = append(out, fmt.Sprintf("[%v]", err))
			continue
		}
		op, ok := rdmapOps[s.Opcode()]
		if !ok {
			op = fmt.Sprintf("op%#x", s.Opcode())
		}
		if s.Last() {
			op += "(L)"
		}
		out = append(out, fmt.Sprintf("%s/%d", op, len(s)))
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, " ")
}

func TestFPDUSummary(t *testing.T) {
	send := fpdu(untagged(opSend, 0, 1, 0, make([]byte, 16)), true)
	write := fpdu(tagged(opWrite, 0x100, 0, make([]byte, 5)), true)
	readReq := fpdu(untagged(opReadReq, 1, 1, 0, make([]byte, 28)), true)
	stream := slices.Concat(send, write, readReq[:7])
	if got, want := fpduSummary(stream, true), "Send(L)/34 Write(L)/19 7 bytes of a cut FPDU"; got != want {
		t.Fatalf("fpduSummary = %q, want %q", got, want)
	}
	if got := fpduSummary(nil, false); got != "nothing" {
		t.Fatalf("fpduSummary(nil) = %q", got)
	}
	// CRCs checked: a corrupted one is named, and the walk goes on.
	bad := slices.Clone(send)
	bad[len(bad)-1] ^= 1
	got := fpduSummary(slices.Concat(bad, write), true)
	if !strings.Contains(got, "mpa crc mismatch") || !strings.HasSuffix(got, " Write(L)/19") {
		t.Fatalf("fpduSummary with a bad CRC = %q", got)
	}
	// Without CRCs the field is there all the same, zero (RFC 5044 §4.4).
	if got := fpduSummary(fpdu(tagged(opWrite, 1, 0, []byte{1}), false), false); got != "Write(L)/15" {
		t.Fatalf("fpduSummary without CRCs = %q", got)
	}
}
