package ddp

import (
	"testing"
	"testing/quick"

	"github.com/rnic-dev/rnic/internal/wiretest"
	"github.com/rnic-dev/rnic/rnic/term"
)

var (
	hx        = wiretest.Hex
	cause     = wiretest.Cause
	wantCause = wiretest.WantCause
)

// Tagged headers of known-answer RDMA Write and Read Response segments
// (ULPDU bytes, after the MPA length).
func TestTaggedVectors(t *testing.T) {
	cases := []struct {
		name  string
		ulpdu string
		f     TaggedFields
	}{
		{"#12 Write", "c1 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03 04 05 06 07",
			TaggedFields{Last: true, RsvdULP: 0x40, STag: 0x12345678, TO: 0x1000}},
		{"#13 Write seg 1", "81 40 12 34 56 78 00 00 00 00 00 00 10 00 00 01 02 03",
			TaggedFields{Last: false, RsvdULP: 0x40, STag: 0x12345678, TO: 0x1000}},
		{"#13 Write seg 2", "c1 40 12 34 56 78 00 00 00 00 00 00 10 04 04 05 06 07",
			TaggedFields{Last: true, RsvdULP: 0x40, STag: 0x12345678, TO: 0x1004}},
		{"#14 zero-length Write", "c1 40 12 34 56 78 00 00 00 00 00 00 10 00",
			TaggedFields{Last: true, RsvdULP: 0x40, STag: 0x12345678, TO: 0x1000}},
		{"#15 Read Response", "c1 42 00 00 ab 01 00 00 00 00 00 00 20 00 00 01 02 03 04 05 06 07",
			TaggedFields{Last: true, RsvdULP: 0x42, STag: 0xAB01, TO: 0x2000}},
		{"#16 zero-length Read Response", "c1 42 00 00 ab 01 00 00 00 00 00 00 20 00",
			TaggedFields{Last: true, RsvdULP: 0x42, STag: 0xAB01, TO: 0x2000}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := hx(t, c.ulpdu)
			h, err := ParseTagged(b)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Fields(); got != c.f {
				t.Fatalf("fields %+v, want %+v", got, c.f)
			}
			if h.DV() != Version || !IsTagged(b[0]) {
				t.Fatalf("DV %d T %v", h.DV(), IsTagged(b[0]))
			}
			enc := make([]byte, TaggedHeaderLen)
			Tagged(enc).Encode(&c.f)
			if string(enc) != string(b[:TaggedHeaderLen]) {
				t.Fatalf("encode % x, want % x", enc, b[:TaggedHeaderLen])
			}
		})
	}
}

// Untagged headers of known-answer Send, Read Request, Terminate and RFC
// 7306 segments.
func TestUntaggedVectors(t *testing.T) {
	cases := []struct {
		name  string
		ulpdu string
		f     UntaggedFields
	}{
		{"#7 Send", "41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 68 65 6c 6c 6f",
			UntaggedFields{Last: true, RsvdULP0: 0x43, QN: 0, MSN: 1, MO: 0}},
		{"#9 Send SE zero", "41 45 00 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x45, QN: 0, MSN: 2}},
		{"#10 Send Inv", "41 44 11 22 33 44 00 00 00 00 00 00 00 03 00 00 00 00 61 62 63 64",
			UntaggedFields{Last: true, RsvdULP0: 0x44, RsvdULP1: 0x11223344, QN: 0, MSN: 3}},
		{"#11 Read Request", "41 41 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x41, QN: 1, MSN: 1}},
		{"#17 Terminate", "41 47 00 00 00 00 00 00 00 02 00 00 00 01 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x47, QN: 2, MSN: 1}},
		{"#22 Atomic Request", "41 4a 00 00 00 00 00 00 00 01 00 00 00 02 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x4A, QN: 1, MSN: 2}},
		{"#23 Atomic Response", "41 4b 00 00 00 00 00 00 00 03 00 00 00 01 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x4B, QN: 3, MSN: 1}},
		{"#25 Immediate", "41 48 00 00 00 00 00 00 00 00 00 00 00 04 00 00 00 00",
			UntaggedFields{Last: true, RsvdULP0: 0x48, QN: 0, MSN: 4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := hx(t, c.ulpdu)
			h, err := ParseUntagged(b)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Fields(); got != c.f {
				t.Fatalf("fields %+v, want %+v", got, c.f)
			}
			enc := make([]byte, UntaggedHeaderLen)
			Untagged(enc).Encode(&c.f)
			if string(enc) != string(b[:UntaggedHeaderLen]) {
				t.Fatalf("encode % x, want % x", enc, b[:UntaggedHeaderLen])
			}
		})
	}
}

// The DDP Terminate causes a DDP header decoder can detect (RFC 5041's
// Tagged and Untagged Buffer errors).
func TestParseErrors(t *testing.T) {
	tagged := hx(t, "c1 40 12 34 56 78 00 00 00 00 00 00 10 00")
	untagged := hx(t, "41 43 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00")

	dv0 := append([]byte(nil), tagged...)
	dv0[0] = 0xC0 // DV=0
	_, err := ParseTagged(dv0)
	wantCause(t, err, term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion)
	dv2 := append([]byte(nil), tagged...)
	dv2[0] = 0xC2
	_, err = ParseTagged(dv2)
	wantCause(t, err, term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion)
	_, err = ParseTagged(tagged[:13])
	wantCause(t, err, term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion)
	_, err = ParseTagged(untagged)
	wantCause(t, err, term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion)

	udv0 := append([]byte(nil), untagged...)
	udv0[0] = 0x40
	_, err = ParseUntagged(udv0)
	wantCause(t, err, term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion)
	_, err = ParseUntagged(untagged[:17])
	wantCause(t, err, term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion)
	_, err = ParseUntagged(tagged[:14:14])
	wantCause(t, err, term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion)
	_, err = ParseUntagged(append(append([]byte(nil), tagged...), 0, 0, 0, 0))
	wantCause(t, err, term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion)

	// Reserved bits 0x3C are not checked on receive (RFC 5041).
	rsv := append([]byte(nil), untagged...)
	rsv[0] |= 0x3C
	if _, err := ParseUntagged(rsv); err != nil {
		t.Fatalf("reserved bits rejected: %v", err)
	}
}

func untaggedHdr(qn, msn, mo uint32, last bool) Untagged {
	h := make(Untagged, UntaggedHeaderLen)
	h.Encode(&UntaggedFields{Last: last, RsvdULP0: 0x43, QN: qn, MSN: msn, MO: mo})
	return h
}

func TestRxQueues(t *testing.T) {
	q := NewRxQueues(3)
	for qn := uint32(0); qn < 3; qn++ {
		if q.ExpectedMSN(qn) != 1 {
			t.Fatalf("QN %d starts at MSN %d", qn, q.ExpectedMSN(qn))
		}
	}
	// QN 3 without atomics, QN 7: invalid QN.
	wantCause(t, q.Check(untaggedHdr(3, 1, 0, true), 0), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN)
	wantCause(t, q.Check(untaggedHdr(7, 1, 0, true), 0), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidQN)
	if NewRxQueues(4).Check(untaggedHdr(3, 1, 0, true), 12) != nil {
		t.Fatal("QN 3 rejected with atomics")
	}
	// Wrong MSN.
	wantCause(t, q.Check(untaggedHdr(0, 2, 0, true), 5), term.LayerDDP, term.DDPUntagged, term.UntaggedMSNRange)
	// A three-segment message, then an MO gap.
	h := untaggedHdr(0, 1, 0, false)
	if err := q.Check(h, 100); err != nil {
		t.Fatal(err)
	}
	q.Advance(h, 100)
	if q.Received(0) != 100 || q.ExpectedMSN(0) != 1 {
		t.Fatalf("after segment 1: got %d msn %d", q.Received(0), q.ExpectedMSN(0))
	}
	wantCause(t, q.Check(untaggedHdr(0, 1, 104, false), 100), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO)
	wantCause(t, q.Check(untaggedHdr(0, 1, 0, false), 100), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO)
	h = untaggedHdr(0, 1, 100, true)
	if err := q.Check(h, 7); err != nil {
		t.Fatal(err)
	}
	q.Advance(h, 7)
	if q.Received(0) != 0 || q.ExpectedMSN(0) != 2 {
		t.Fatalf("after last: got %d msn %d", q.Received(0), q.ExpectedMSN(0))
	}
	// Other QNs are independent.
	if q.ExpectedMSN(1) != 1 || q.ExpectedMSN(7) != 0 {
		t.Fatal("queues not independent")
	}
	// MO + payload past 2^32.
	q2 := NewRxQueues(3)
	big := untaggedHdr(0, 1, 0, false)
	// In two calls: a payload length is an int, 32 bits on some targets.
	q2.Advance(big, 0x7FFFFFF8)
	q2.Advance(big, 0x7FFFFFF8)
	wantCause(t, q2.Check(untaggedHdr(0, 1, 0xFFFFFFF0, true), 0x11), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO)
	if err := q2.Check(untaggedHdr(0, 1, 0xFFFFFFF0, true), 0x10); err != nil {
		t.Fatal(err)
	}
	// A segment that is not the last may not end at 2^32: the next one would
	// need MO 2^32, and the count would wrap to 0 (an MO 0 replay passing).
	wantCause(t, q2.Check(untaggedHdr(0, 1, 0xFFFFFFF0, false), 0x10), term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidMO)
	if err := q2.Check(untaggedHdr(0, 1, 0xFFFFFFF0, false), 0xF); err != nil {
		t.Fatal(err)
	}
}

func TestMSNWrap(t *testing.T) {
	q := NewRxQueues(3)
	q.msn[0] = 0xFFFFFFFF
	h := untaggedHdr(0, 0xFFFFFFFF, 0, true)
	if err := q.Check(h, 0); err != nil {
		t.Fatal(err)
	}
	q.Advance(h, 0)
	if q.ExpectedMSN(0) != 0 {
		t.Fatalf("after 0xFFFFFFFF expected %d, want 0", q.ExpectedMSN(0))
	}
	if err := q.Check(untaggedHdr(0, 0, 0, true), 0); err != nil {
		t.Fatal(err)
	}

	var tx TxQueues
	if got := tx.Next(0); got != 1 {
		t.Fatalf("first MSN %d", got)
	}
	if got := tx.Next(0); got != 2 {
		t.Fatalf("second MSN %d", got)
	}
	if got := tx.Next(1); got != 1 {
		t.Fatalf("QN 1 first MSN %d", got)
	}
	tx.sent[2] = 0xFFFFFFFE
	if got := tx.Next(2); got != 0xFFFFFFFF {
		t.Fatalf("MSN %x", got)
	}
	if got := tx.Next(2); got != 0 {
		t.Fatalf("MSN after 0xFFFFFFFF is %d", got)
	}
	if got := tx.Next(9); got != 0 {
		t.Fatalf("untracked QN gave %d", got)
	}
}

func TestSegments(t *testing.T) {
	type seg struct{ off, n int }
	collect := func(msg, max int) []seg {
		var out []seg
		for o, n := range Segments(msg, max) {
			out = append(out, seg{o, n})
		}
		return out
	}
	check := func(got []seg, want ...seg) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("got %v, want %v", got, want)
			}
		}
	}
	check(collect(0, 100), seg{0, 0})
	check(collect(8, 4), seg{0, 4}, seg{4, 4})
	check(collect(10, 4), seg{0, 4}, seg{4, 4}, seg{8, 2})
	check(collect(3, 100), seg{0, 3})
	check(collect(5, 0), seg{0, 5})
	check(collect(-1, 4))
	// Early stop.
	n := 0
	for range Segments(1000, 1) {
		n++
		if n == 3 {
			break
		}
	}
	if n != 3 {
		t.Fatal("break ignored")
	}
}

func TestRoundTrip(t *testing.T) {
	tagged := func(f TaggedFields) bool {
		b := make([]byte, TaggedHeaderLen+3)
		Tagged(b).Encode(&f)
		h, err := ParseTagged(b)
		return err == nil && h.Fields() == f
	}
	untagged := func(f UntaggedFields) bool {
		b := make([]byte, UntaggedHeaderLen)
		Untagged(b).Encode(&f)
		h, err := ParseUntagged(b)
		return err == nil && h.Fields() == f
	}
	setters := func(f TaggedFields, g UntaggedFields) bool {
		a := make(Tagged, TaggedHeaderLen)
		a.Encode(&TaggedFields{})
		a.SetLast(f.Last)
		a.SetRsvdULP(f.RsvdULP)
		a.SetSTag(f.STag)
		a.SetTO(f.TO)
		u := make(Untagged, UntaggedHeaderLen)
		u.Encode(&UntaggedFields{Last: true})
		u.SetLast(g.Last)
		u.SetRsvdULP0(g.RsvdULP0)
		u.SetRsvdULP1(g.RsvdULP1)
		u.SetQN(g.QN)
		u.SetMSN(g.MSN)
		u.SetMO(g.MO)
		return a.Fields() == f && u.Fields() == g
	}
	for _, fn := range []any{tagged, untagged, setters} {
		if err := quick.Check(fn, &quick.Config{MaxCount: 2000}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	tb := make([]byte, TaggedHeaderLen)
	ub := make([]byte, UntaggedHeaderLen)
	q := NewRxQueues(4)
	var tx TxQueues
	var sink uint64
	n := testing.AllocsPerRun(100, func() {
		Tagged(tb).Encode(&TaggedFields{Last: true, STag: 5, TO: 9})
		h, _ := ParseTagged(tb)
		sink += uint64(h.STag()) + h.TO()
		Untagged(ub).Encode(&UntaggedFields{Last: true, QN: 0, MSN: q.ExpectedMSN(0)})
		u, _ := ParseUntagged(ub)
		if q.Check(u, 10) == nil {
			q.Advance(u, 10)
		}
		sink += uint64(u.MSN()+u.MO()+u.QN()) + uint64(tx.Next(1))
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
	_ = sink
}
