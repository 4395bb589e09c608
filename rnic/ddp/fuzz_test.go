package ddp

import (
	"encoding/binary"
	"testing"

	"github.com/rnic-dev/rnic/rnic/term"
)

// FuzzDDP feeds arbitrary bytes to both header decoders and, as a sequence
// of (header, payload length) records, to RxQueues. Decoded headers must
// re-encode to the same bytes (reserved bits aside) and the queue state must
// only move as Advance documents.
func FuzzDDP(f *testing.F) {
	for _, s := range []string{
		"c1 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 04 05 06 07",
		"81 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03",
		"c1 42 00 00 ab 01 00 00 00 00 00 00 20 00",
		"41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 05",
		"41 44 11 22 33 44 00 00 00 00 00 00 00 03 00 00 00 00 00 04",
		"01 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 10 41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 10 00 01",
		"41 4b 00 00 00 00 00 00 00 03 00 00 00 01 00 00 00 00 00 0c",
		"40 43 00 00 00 00 00 00 00 07 00 00 00 01 00 00 00 00 00 00",
	} {
		f.Add(hx(f, s), uint8(4))
	}
	f.Fuzz(func(t *testing.T, data []byte, numQN uint8) {
		if h, err := ParseTagged(data); err == nil {
			fl := h.Fields()
			b := make([]byte, TaggedHeaderLen)
			Tagged(b).Encode(&fl)
			if b[0] != data[0]&^maskReserved || string(b[1:]) != string(data[1:TaggedHeaderLen]) {
				t.Fatalf("tagged re-encode % x != % x", b, data[:TaggedHeaderLen])
			}
		} else {
			checkCause(t, err, term.DDPTagged, term.TaggedInvalidVersion)
		}
		if h, err := ParseUntagged(data); err == nil {
			fl := h.Fields()
			b := make([]byte, UntaggedHeaderLen)
			Untagged(b).Encode(&fl)
			if b[0] != data[0]&^maskReserved || string(b[1:]) != string(data[1:UntaggedHeaderLen]) {
				t.Fatalf("untagged re-encode % x != % x", b, data[:UntaggedHeaderLen])
			}
		} else {
			checkCause(t, err, term.DDPUntagged, term.UntaggedInvalidVersion)
		}

		q := NewRxQueues(int(numQN % 6))
		for rec := data; len(rec) >= UntaggedHeaderLen+2; rec = rec[UntaggedHeaderLen+2:] {
			h := Untagged(rec[:UntaggedHeaderLen])
			n := int(binary.BigEndian.Uint16(rec[UntaggedHeaderLen:]))
			qn := h.QN()
			msn, got := q.ExpectedMSN(qn), q.Received(qn)
			err := q.Check(h, n)
			if err != nil {
				c := cause(t, err)
				if c.Layer != term.LayerDDP || c.EType != term.DDPUntagged ||
					(c.Code != term.UntaggedInvalidQN && c.Code != term.UntaggedMSNRange && c.Code != term.UntaggedInvalidMO) {
					t.Fatalf("unexpected cause %v", c)
				}
				continue
			}
			if h.MSN() != msn || h.MO() != got || int(qn) >= q.NumQueues() {
				t.Fatalf("accepted QN %d MSN %d MO %d, state MSN %d got %d", qn, h.MSN(), h.MO(), msn, got)
			}
			q.Advance(h, n)
			if h.Last() {
				if q.ExpectedMSN(qn) != msn+1 || q.Received(qn) != 0 {
					t.Fatal("Last did not advance the MSN")
				}
			} else if q.Received(qn) != got+uint32(n) || q.ExpectedMSN(qn) != msn {
				t.Fatal("non-last segment moved the state wrongly")
			}
		}
		for range Segments(len(data), int(numQN)) {
		}
	})
}

func checkCause(t *testing.T, err error, e term.EType, c term.Code) {
	t.Helper()
	got := cause(t, err)
	if got != (term.Cause{Layer: term.LayerDDP, EType: e, Code: c}) {
		t.Fatalf("cause %v", got)
	}
}
