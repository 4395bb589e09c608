package linuxvm

import (
	"encoding/binary"
	"errors"
	"fmt"
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
