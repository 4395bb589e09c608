package mpa

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"testing"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func TestPadAndLen(t *testing.T) {
	for n, want := range map[int][2]int{14: {0, 20}, 18: {0, 24}, 22: {0, 28}, 23: {3, 32}, 46: {0, 52}, 30: {0, 36}, 15: {3, 24}, 16: {2, 24}, 17: {1, 24}} {
		if PadLen(n) != want[0] || FPDULen(n) != want[1] {
			t.Errorf("ULPDU %d: pad %d len %d, want %v", n, PadLen(n), FPDULen(n), want)
		}
		if (HeaderLen+n+PadLen(n))%4 != 0 {
			t.Errorf("ULPDU %d misaligned", n)
		}
	}
	// Whole FPDUs: Read Request 52, Atomic Request 76, Atomic Response 36,
	// Immediate 32, 4-byte Terminate 28.
	for ulpdu, total := range map[int]int{18 + 28: 52, 18 + 52: 76, 18 + 12: 36, 18 + 8: 32, 18 + 4: 28} {
		if FPDULen(ulpdu) != total {
			t.Errorf("FPDULen(%d) = %d, want %d", ulpdu, FPDULen(ulpdu), total)
		}
	}
}

func TestMULPDU(t *testing.T) {
	cases := []struct {
		emss    int
		markers bool
		want    int
	}{
		{1460, false, 1460 - 6},
		{1460, true, 1460 - (6 + 4*3)},
		{1448, false, 1448 - 6},
		{1449, false, 1449 - 7},
		{512, true, 512 - 10},
		{513, true, 513 - (6 + 8 + 1)},
		{65483, false, 65483 - (6 + 3)},
		{200000, false, MaxULPDU},
		{3, false, 0},
		{0, true, 0},
		{-5, false, 0},
	}
	for _, c := range cases {
		if got := MULPDU(c.emss, c.markers); got != c.want {
			t.Errorf("MULPDU(%d, %v) = %d, want %d", c.emss, c.markers, got, c.want)
		}
	}
}

// TestAppendFPDU: framing, pad, CRC coverage and byte order (RFC 5044 §4:
// the CRC32c covers length, ULPDU and pad, least significant byte first), on
// a known-answer Send of "hello".
func TestAppendFPDU(t *testing.T) {
	hdr := hx(t, "41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00")
	want := hx(t, "00 17 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 68 65 6c 6c 6f 00 00 00 b9 90 b1 0c")
	got := AppendFPDU([]byte("xy"), hdr, []byte("hello"), true)
	if !bytes.Equal(got[2:], want) || string(got[:2]) != "xy" {
		t.Fatalf("#7\n got % x\nwant % x", got[2:], want)
	}
	// The CRC is the standard CRC32c of length+ULPDU+pad, little-endian.
	if c := crc32.Checksum(want[:28], castagnoli); c != 0x0CB190B9 {
		t.Fatalf("reference CRC %08x", c)
	}
	nocrc := AppendFPDU(nil, hdr, []byte("hello"), false)
	if !bytes.Equal(nocrc[:28], want[:28]) || !bytes.Equal(nocrc[28:], []byte{0, 0, 0, 0}) {
		t.Fatalf("#8 % x", nocrc)
	}
	// Every split of one ULPDU between hdr and payload gives the same FPDU.
	ulpdu := want[2:25]
	for k := 0; k <= len(ulpdu); k++ {
		if got := AppendFPDU(make([]byte, 0, 3), ulpdu[:k], ulpdu[k:], true); !bytes.Equal(got, want) {
			t.Fatalf("split %d: % x", k, got)
		}
	}
	if c := crc32.Checksum([]byte("123456789"), castagnoli); c != 0xE3069283 {
		t.Fatalf("check value %08x", c)
	}
}

func TestAppendFPDUTooLong(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a 65536-byte ULPDU")
		}
	}()
	AppendFPDU(nil, make([]byte, 18), make([]byte, MaxULPDU-17), true)
}

func BenchmarkAppendFPDU(b *testing.B) {
	hdr := make([]byte, 18)
	for _, n := range []int{0, 1024, 8192, 65000} {
		payload := make([]byte, n)
		dst := make([]byte, 0, FPDULen(len(hdr)+n))
		b.Run(fmt.Sprintf("payload=%d", n), func(b *testing.B) {
			b.SetBytes(int64(FPDULen(len(hdr) + n)))
			for b.Loop() {
				dst = AppendFPDU(dst[:0], hdr, payload, true)
			}
		})
	}
}
