package linuxvm

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"
)

// Minimal iWARP framing for TestSiwResponder, which plays an MPA initiator
// against the VM's siw by hand. The project's real codecs live in rnic/mpa,
// rnic/ddp and rnic/rdmap; this only has to be right for a few messages.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RDMAP opcodes (RFC 5040 §4.2).
const (
	opWrite     = 0
	opReadReq   = 1
	opReadResp  = 2
	opSend      = 3
	opTerminate = 7
)

// fpdu frames ulpdu as an MPA FPDU: ULPDU_LENGTH, ULPDU, zero pad to 4
// bytes, and the CRC32c (little-endian on the wire) or zeros.
func fpdu(ulpdu []byte, withCRC bool) []byte {
	n := 2 + len(ulpdu)
	pad := (4 - n%4) % 4
	b := make([]byte, n+pad+4)
	binary.BigEndian.PutUint16(b, uint16(len(ulpdu)))
	copy(b[2:], ulpdu)
	if withCRC {
		binary.LittleEndian.PutUint32(b[n+pad:], crc32.Checksum(b[:n+pad], castagnoli))
	}
	return b
}

// untagged builds an untagged DDP segment with RDMAP header (last segment).
func untagged(op byte, qn, msn, mo uint32, payload []byte) []byte {
	b := make([]byte, 18+len(payload))
	b[0] = 0x40 | 0x01 // L, DDP version 1
	b[1] = 0x40 | op   // RDMAP version 1
	binary.BigEndian.PutUint32(b[6:], qn)
	binary.BigEndian.PutUint32(b[10:], msn)
	binary.BigEndian.PutUint32(b[14:], mo)
	copy(b[18:], payload)
	return b
}

// tagged builds a tagged DDP segment with RDMAP header (last segment).
func tagged(op byte, stag uint32, to uint64, payload []byte) []byte {
	b := make([]byte, 14+len(payload))
	b[0] = 0x80 | 0x40 | 0x01 // T, L, DDP version 1
	b[1] = 0x40 | op
	binary.BigEndian.PutUint32(b[2:], stag)
	binary.BigEndian.PutUint64(b[6:], to)
	copy(b[14:], payload)
	return b
}

// segment is a received DDP segment (the ULPDU of one FPDU).
type segment []byte

func (s segment) Tagged() bool { return s[0]&0x80 != 0 }
func (s segment) Last() bool   { return s[0]&0x40 != 0 }
func (s segment) Opcode() byte { return s[1] & 0x0f }
func (s segment) STag() uint32 { return binary.BigEndian.Uint32(s[2:6]) }
func (s segment) TO() uint64   { return binary.BigEndian.Uint64(s[6:14]) }
func (s segment) QN() uint32   { return binary.BigEndian.Uint32(s[6:10]) }
func (s segment) MSN() uint32  { return binary.BigEndian.Uint32(s[10:14]) }
func (s segment) MO() uint32   { return binary.BigEndian.Uint32(s[14:18]) }

// Payload is what follows the DDP/RDMAP header.
func (s segment) Payload() []byte {
	if s.Tagged() {
		return s[14:]
	}
	return s[18:]
}

var (
	errShortSegment = errors.New("ddp segment too short")
	errBadCRC       = errors.New("mpa crc mismatch")
)

// parseFPDU checks one complete FPDU (as read by readFPDU) and returns its
// ULPDU.
func parseFPDU(b []byte, withCRC bool) (segment, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("fpdu: %w", errShortSegment)
	}
	n := 2 + int(binary.BigEndian.Uint16(b))
	pad := (4 - n%4) % 4
	if len(b) != n+pad+4 {
		return nil, fmt.Errorf("fpdu: %d bytes for ULPDU_LENGTH %d: %w", len(b), n-2, errShortSegment)
	}
	if withCRC {
		got, want := binary.LittleEndian.Uint32(b[n+pad:]), crc32.Checksum(b[:n+pad], castagnoli)
		if got != want {
			return nil, fmt.Errorf("fpdu: crc %08x, computed %08x: %w", got, want, errBadCRC)
		}
	}
	s := segment(b[2:n])
	if len(s) < 2 || (s.Tagged() && len(s) < 14) || (!s.Tagged() && len(s) < 18) {
		return nil, fmt.Errorf("fpdu: %d-byte ULPDU: %w", len(s), errShortSegment)
	}
	return s, nil
}

// readFPDU reads one FPDU (no markers) from r and returns its raw bytes.
func readFPDU(r io.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := 2 + int(binary.BigEndian.Uint16(h[:]))
	pad := (4 - n%4) % 4
	b := make([]byte, n+pad+4)
	copy(b, h[:])
	if _, err := io.ReadFull(r, b[2:]); err != nil {
		return nil, err
	}
	return b, nil
}

// readMPARR reads an MPA Request/Reply frame.
func readMPARR(r io.Reader) (mpaRR, error) {
	h := make([]byte, mpaRRHeaderLen)
	if _, err := io.ReadFull(r, h); err != nil {
		return nil, err
	}
	b := make([]byte, mpaRRHeaderLen+int(binary.BigEndian.Uint16(h[18:20])))
	copy(b, h)
	if _, err := io.ReadFull(r, b[mpaRRHeaderLen:]); err != nil {
		return nil, err
	}
	return parseMPARR(b)
}

// mpaRequest encodes an MPA Request frame.
func mpaRequest(flags, rev byte, pd []byte) []byte {
	b := make([]byte, mpaRRHeaderLen+len(pd))
	copy(b, "MPA ID Req Frame")
	b[16], b[17] = flags, rev
	binary.BigEndian.PutUint16(b[18:], uint16(len(pd)))
	copy(b[20:], pd)
	return b
}

// irdORD encodes the RFC 6581 IRD/ORD words.
func irdORD(ird, ord uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, ird)
	binary.BigEndian.PutUint16(b[2:], ord)
	return b
}

// peerConn is the test's side of one connection to the guest.
type peerConn struct {
	t   *testing.T
	c   net.Conn
	crc bool
}

func (p *peerConn) send(b []byte) {
	p.t.Helper()
	p.t.Logf("-> % x", b)
	if _, err := p.c.Write(b); err != nil {
		p.t.Fatalf("write: %v", err)
	}
}

func (p *peerConn) sendSeg(ulpdu []byte) { p.t.Helper(); p.send(fpdu(ulpdu, p.crc)) }

// recvSeg reads the next FPDU within d.
func (p *peerConn) recvSeg(d time.Duration) (segment, error) {
	p.c.SetReadDeadline(time.Now().Add(d))
	b, err := readFPDU(p.c)
	if err != nil {
		return nil, err
	}
	p.t.Logf("<- % x", b)
	return parseFPDU(b, p.crc)
}

// expectQuiet checks that the guest sends nothing within d.
func (p *peerConn) expectQuiet(d time.Duration) {
	p.t.Helper()
	p.c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := p.c.Read(b[:])
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		p.t.Errorf("expected silence for %v, got %d bytes, err %v", d, n, err)
	}
}

func FuzzParseFPDU(f *testing.F) {
	f.Add(fpdu(untagged(opSend, 0, 1, 0, make([]byte, 16)), true), true)
	f.Add(fpdu(tagged(opWrite, 0x1234, 0, []byte("abc")), false), false)
	f.Add([]byte{0x00, 0x02, 0xc1, 0x40, 0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, b []byte, withCRC bool) {
		s, err := parseFPDU(b, withCRC)
		if err != nil {
			if !errors.Is(err, errShortSegment) && !errors.Is(err, errBadCRC) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		_ = s.Payload()
		if s.Tagged() {
			_, _ = s.STag(), s.TO()
		} else {
			_, _, _ = s.QN(), s.MSN(), s.MO()
		}
	})
}

func TestFPDURoundTrip(t *testing.T) {
	for _, withCRC := range []bool{false, true} {
		in := untagged(opSend, 0, 7, 0, []byte("hello"))
		b := fpdu(in, withCRC)
		if len(b)%4 != 0 {
			t.Fatalf("fpdu length %d not a multiple of 4", len(b))
		}
		s, err := parseFPDU(b, withCRC)
		if err != nil {
			t.Fatal(err)
		}
		if s.Opcode() != opSend || s.MSN() != 7 || string(s.Payload()) != "hello" || !s.Last() || s.Tagged() {
			t.Fatalf("round trip: % x", []byte(s))
		}
	}
	// A CRC32c on the wire, observed from siw (crc1 build): an rping client
	// Send of 16 bytes, CRC 0x2d0479c3 sent as c3 79 04 2d.
	b, err := hex.DecodeString("00224143000000000000000000000001000000000000557aadac27001d2d2a0000000064c379042d")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseFPDU(b, true); err != nil {
		t.Fatalf("observed siw FPDU: %v", err)
	}
}
