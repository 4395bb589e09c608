package rnic

import (
	"bytes"
	"testing"
)

func TestSplitExt(t *testing.T) {
	pd := withExt([]byte("ulp"), true)
	if m, ulp, ok := splitExt(pd); !ok || m != maxULPDU || string(ulp) != "ulp" {
		t.Fatalf("round trip: %d %q %v", m, ulp, ok)
	}
	if got := withExt([]byte("ulp"), false); string(got) != "ulp" {
		t.Fatalf("not offered: %q", got)
	}
	for name, pd := range map[string][]byte{
		"short":        []byte("RNX1\xff\xf7\x00"),
		"other magic":  []byte("RNX2\xff\xf7\x00\x00"),
		"reserved set": []byte("RNX1\xff\xf7\x00\x01rest"),
		"tiny ULPDU":   []byte("RNX1\x00\x10\x00\x00rest"),
	} {
		if m, ulp, ok := splitExt(pd); ok || m != 0 || !bytes.Equal(ulp, pd) {
			t.Errorf("%s: %d %q %v, want the private data whole", name, m, ulp, ok)
		}
	}
}

// A look-alike block is the peer's own private data unless large FPDUs were
// offered: it reaches the ULP byte for byte in a Reply to an Initiator that
// did not offer them and in a Request whose block is not well-formed (and
// in a Reject: TestRejectedConnection).
func TestExtOnlyWhenOffered(t *testing.T) {
	lookalike := append(withExt(nil, true), "resp"...)
	malformed := []byte("RNX1\xff\xf7\x00\x01init")
	for _, v := range []struct {
		name string
		o    pairOpts
	}{
		{"initiator-not-offering", pairOpts{accept: func(p *AcceptParams) { p.PrivateData = lookalike }}},
		{"malformed-offer", pairOpts{connect: func(p *ConnParams) { p.PrivateData = malformed },
			accept: func(p *AcceptParams) { p.PrivateData = lookalike }}},
	} {
		t.Run(v.name, func(t *testing.T) {
			a, b := newPair(t, v.o, nil)
			if !bytes.Equal(a.info.PrivateData, lookalike) {
				t.Fatalf("Initiator got private data %q, the Responder sent %q", a.info.PrivateData, lookalike)
			}
			if a.info.LargeFPDU || b.info.LargeFPDU {
				t.Fatalf("large FPDUs %v/%v", a.info.LargeFPDU, b.info.LargeFPDU)
			}
			if v.name == "malformed-offer" && !bytes.Equal(b.info.PrivateData, malformed) {
				t.Fatalf("Responder got private data %q, the Initiator sent %q", b.info.PrivateData, malformed)
			}
			exchange(t, a, b)
		})
	}
}
