package blockproto

import (
	"bytes"
	"errors"
	"testing"
)

// seeds returns one valid encoding of every message type.
func seeds(t testing.TB) [][]byte {
	var out [][]byte
	out = append(out, sampleLogin(t, false), sampleLogin(t, true), sampleWelcome(t))
	il, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 4, Inline: 8192, Initiator: "i", Volume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	wf := sampleWelcome(t).Fields()
	wf.Inline = 4096
	iw, err := EncodeWelcome(make([]byte, MaxMessage), &wf)
	if err != nil {
		t.Fatal(err)
	}
	el, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 4, Extents: true, Initiator: "i", Volume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	wf.Extents = true
	ew, err := EncodeWelcome(make([]byte, MaxMessage), &wf)
	if err != nil {
		t.Fatal(err)
	}
	nl, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 4, Extents: true, NoHole: true, Initiator: "i", Volume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	wf.NoHole = true
	nw, err := EncodeWelcome(make([]byte, MaxMessage), &wf)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, il, iw, el, ew, nl, nw)
	for _, f := range []ExtentsFields{
		{Tag: 9, Extents: []ExtentFields{{Length: 4096, Flags: ExtentHole | ExtentZero}}},
		{Tag: 10, Grant: GrantFields{STag: 3, Len: 4096}, Extents: []ExtentFields{{Length: 512}, {Length: 1 << 20, Flags: ExtentZero},
			{Length: 65536, Flags: ExtentHole | ExtentZero}}},
	} {
		m, err := EncodeExtents(make([]byte, MaxMessage), &f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	for _, f := range []DataFields{{Tag: 6, Len: 512}, {Tag: 7, Grant: GrantFields{STag: 3, Len: 4096, TO: 64}, Len: 4096}} {
		m, err := EncodeData(make([]byte, DataLen(int(f.Len))), &f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range m.Payload() {
			m.Payload()[i] = byte(i * 7)
		}
		out = append(out, m)
	}
	var n [NonceLen]byte
	out = append(out, EncodeChallenge(make([]byte, ChallengeLen), &n))
	out = append(out, EncodeProof(make([]byte, ProofMsgLen), make([]byte, ProofLen)))
	for _, f := range []CommandFields{
		{Op: OpRead, Tag: 3, Offset: 4096, Length: 8192},
		{Op: OpRead, Flags: FlagInline, Tag: 8, Offset: 512, Length: 4096},
		{Op: OpWrite, Flags: FlagFUA, Tag: 5, Offset: 512, Length: 512, STag: 0x1234, Token: 99},
		{Op: OpFlush}, {Op: OpTrim, Length: 4096}, {Op: OpWriteZeroes, Length: 512},
		{Op: OpWriteZeroes, Flags: FlagFUA | FlagNoHole, Tag: 12, Offset: 8192, Length: 4096, Token: 3},
		{Op: OpWriteReq, Length: 1 << 20}, {Op: OpRelease, STag: 9}, {Op: OpHolder, Offset: 2},
		{Op: OpBlockStatus, Tag: 11, Offset: 1 << 30, Length: 1<<32 - 4096},
	} {
		b := make([]byte, CommandLen)
		Command(b).Encode(&f)
		out = append(out, b)
	}
	for _, f := range []ResponseFields{
		{Op: OpResponse, Tag: 1, Status: StatusOK, Grant: GrantFields{STag: 5, Len: 4096}},
		{Op: OpResponse, Tag: 2, Status: StatusReserved, Value: 1<<63 | 2, Detail: "host-b"},
		{Op: OpReject, Status: StatusAuth, Detail: "authentication failed"},
		{Op: OpGoodbye, Status: StatusShutdown},
	} {
		m, err := EncodeResponse(make([]byte, MaxMessage), &f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	out = append(out, EncodeReady(make([]byte, ReadyLen), &ReadyFields{Tag: 4, Buffer: GrantFields{STag: 8, Len: 512}}))
	return out
}

func addSeeds(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add(s)
	}
}

// reencode checks that a decoded message re-encodes to the same bytes.
func reencode(t *testing.T, name string, in, out []byte) {
	if !bytes.Equal(in, out) {
		t.Fatalf("%s re-encodes differently:\n in % x\nout % x", name, in, out)
	}
}

func isDecodeError(t *testing.T, err error) {
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
	}
}

// FuzzCheck runs the dispatching decoder: it must never panic and every
// failure is a *DecodeError.
func FuzzCheck(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Check(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		if h.Version() != Version {
			t.Fatal("accepted another version")
		}
	})
}

func FuzzLogin(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseLogin(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		out, err := EncodeLogin(make([]byte, MaxMessage), &fl)
		if err != nil {
			t.Fatalf("decoded LOGIN does not encode: %v", err)
		}
		reencode(t, "LOGIN", b, out)
	})
}

func FuzzChallengeProof(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := ParseChallenge(b); err == nil {
			var n [NonceLen]byte
			copy(n[:], m.Nonce())
			reencode(t, "CHALLENGE", b, EncodeChallenge(make([]byte, ChallengeLen), &n))
		} else {
			isDecodeError(t, err)
		}
		if m, err := ParseProof(b); err == nil {
			reencode(t, "PROOF", b, EncodeProof(make([]byte, ProofMsgLen), m.MAC()))
		} else {
			isDecodeError(t, err)
		}
	})
}

func FuzzWelcome(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseWelcome(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		out, err := EncodeWelcome(make([]byte, MaxMessage), &fl)
		if err != nil {
			t.Fatalf("decoded WELCOME does not encode: %v", err)
		}
		reencode(t, "WELCOME", b, out)
	})
}

func FuzzCommand(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCommand(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := c.Fields()
		out := make([]byte, CommandLen)
		Command(out).Encode(&fl)
		reencode(t, "command", b, out)
		if !fl.Op.IsCommand() || c.Offset()+uint64(c.Length()) < c.Offset() {
			t.Fatalf("accepted %+v", fl)
		}
	})
}

func FuzzResponse(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseResponse(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		out, err := EncodeResponse(make([]byte, MaxMessage), &fl)
		if err != nil {
			t.Fatalf("decoded response does not encode: %v", err)
		}
		reencode(t, "response", b, out)
	})
}

func FuzzReady(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseReady(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		reencode(t, "READY", b, EncodeReady(make([]byte, ReadyLen), &fl))
	})
}

func FuzzData(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseData(b)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		out, err := EncodeData(make([]byte, DataLen(MaxInline)), &fl)
		if err != nil {
			t.Fatalf("decoded DATA does not encode: %v", err)
		}
		copy(out.Payload(), m.Payload())
		reencode(t, "DATA", b, out)
	})
}

func FuzzExtents(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseExtents(b, 512)
		if err != nil {
			isDecodeError(t, err)
			return
		}
		fl := m.Fields()
		out, err := EncodeExtents(make([]byte, MaxMessage), &fl)
		if err != nil {
			t.Fatalf("decoded EXTENTS does not encode: %v", err)
		}
		reencode(t, "EXTENTS", b, out)
		var total uint64
		for _, e := range fl.Extents {
			if e.Length == 0 || e.Length%512 != 0 {
				t.Fatalf("accepted an extent of %d bytes", e.Length)
			}
			total += uint64(e.Length)
		}
		if total >= 1<<32 {
			t.Fatalf("accepted extents covering %d bytes", total)
		}
	})
}
