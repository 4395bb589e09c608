package blockproto

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func sampleLogin(t testing.TB, join bool) Login {
	t.Helper()
	f := LoginFields{Credits: 32, Initiator: "host-a", Volume: "vol0"}
	if join {
		f.Join, f.SessionID = true, 0x1122334455667788
	}
	for i := range f.Nonce {
		f.Nonce[i] = byte(i)
	}
	m, err := EncodeLogin(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sampleWelcome(t testing.TB) Welcome {
	t.Helper()
	f := WelcomeFields{SessionID: 7, BootID: 9, VolumeSize: 1 << 30, VolumeID: 3, MaxTransfer: 1 << 20,
		GrantSize: 128 << 10, Credits: 32, Slot: 5, LockSTag: 0xabcdef01, LockCount: 64, LockTO: 4096,
		MinIO: 512, PreferredIO: 4096, Grants: []GrantFields{{STag: 0x100, Len: 132 << 10}, {STag: 0x200, Len: 132 << 10, TO: 8}}}
	for i := range f.TargetProof {
		f.TargetProof[i] = 0xEE
	}
	m, err := EncodeWelcome(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLoginLayout pins the byte layout of the package documentation.
func TestLoginLayout(t *testing.T) {
	m := sampleLogin(t, true)
	want := "01010001 00000000" + "0020 06 04 00000000" + "1122334455667788" +
		"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" + hex.EncodeToString([]byte("host-avol0"))
	want = strings.ReplaceAll(want, " ", "")
	if got := hex.EncodeToString(m); got != want {
		t.Fatalf("LOGIN\n got %s\nwant %s", got, want)
	}
	p, err := ParseLogin(m)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Fields()
	if !f.Join || f.SessionID != 0x1122334455667788 || f.Initiator != "host-a" || f.Volume != "vol0" || f.Credits != 32 {
		t.Fatalf("fields %+v", f)
	}
}

func TestLoginRejects(t *testing.T) {
	good := sampleLogin(t, false)
	cases := []struct {
		name string
		mod  func(b []byte) []byte
		kind error
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrShort},
		{"trailing", func(b []byte) []byte { return append(b, 0) }, ErrLength},
		{"version", func(b []byte) []byte { b[0] = 2; return b }, ErrVersion},
		{"opcode", func(b []byte) []byte { b[1] = OpProof.u8(); return b }, ErrOpcode},
		{"flags", func(b []byte) []byte { b[3] = 0x10; return b }, ErrFlags},
		{"inline without size", func(b []byte) []byte { b[3] = 2; return b }, ErrField},
		{"inline unaligned", func(b []byte) []byte { b[3], b[14], b[15] = 2, 0x10, 1; return b }, ErrField},
		{"inline too large", func(b []byte) []byte { b[3], b[13], b[14] = 2, 1, 0; return b }, ErrField},
		{"tag", func(b []byte) []byte { b[7] = 1; return b }, ErrReserved},
		{"reserved", func(b []byte) []byte { b[13] = 1; return b }, ErrReserved},
		{"credits", func(b []byte) []byte { b[8], b[9] = 0, 0; return b }, ErrField},
		{"join without session", func(b []byte) []byte { b[3] = 1; return b }, ErrField},
		{"session without join", func(b []byte) []byte { b[20] = 1; return b }, ErrField},
		{"control char", func(b []byte) []byte { b[LoginFixedLen] = '\n'; return b }, ErrField},
		{"bad utf8", func(b []byte) []byte { b[LoginFixedLen] = 0xff; return b }, ErrField},
		{"empty name", func(b []byte) []byte { b[10] = 0; return b[:len(b)-6] }, ErrField},
	}
	for _, c := range cases {
		b := c.mod(append([]byte(nil), good...))
		_, err := ParseLogin(b)
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.kind)
		}
		var de *DecodeError
		if err != nil && !errors.As(err, &de) {
			t.Errorf("%s: %T is not a *DecodeError", c.name, err)
		}
	}
	if _, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 1, Initiator: "", Volume: "v"}); !errors.Is(err, ErrField) {
		t.Fatalf("empty name encoded: %v", err)
	}
	long := strings.Repeat("x", 256)
	if _, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 1, Initiator: long, Volume: "v"}); !errors.Is(err, ErrField) {
		t.Fatalf("256-byte name encoded: %v", err)
	}
	if _, err := EncodeLogin(make([]byte, 10), &LoginFields{Credits: 1, Initiator: "a", Volume: "v"}); !errors.Is(err, ErrShort) {
		t.Fatalf("short buffer: %v", err)
	}
}

func (o Opcode) u8() byte { return byte(o) }

func TestWelcomeRoundTrip(t *testing.T) {
	m := sampleWelcome(t)
	if len(m) != WelcomeFixedLen+2*GrantLen {
		t.Fatalf("length %d", len(m))
	}
	p, err := ParseWelcome(m)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Fields()
	if f.SessionID != 7 || f.BootID != 9 || f.VolumeSize != 1<<30 || f.Slot != 5 || f.LockSTag != 0xabcdef01 ||
		f.LockTO != 4096 || len(f.Grants) != 2 || f.Grants[1] != (GrantFields{STag: 0x200, Len: 132 << 10, TO: 8}) ||
		f.MinIO != 512 || f.PreferredIO != 4096 || f.TargetProof[31] != 0xEE {
		t.Fatalf("fields %+v", f)
	}
	b2, err := EncodeWelcome(make([]byte, MaxMessage), &f)
	if err != nil || !bytes.Equal(b2, m) {
		t.Fatalf("re-encode differs: %v", err)
	}
	bad := map[string]func(b []byte){
		"session 0":     func(b []byte) { clear(b[8:16]) },
		"size":          func(b []byte) { b[31] = 1 },
		"minio":         func(b []byte) { b[65] = 3 },
		"min>pref":      func(b []byte) { b[64], b[65], b[66], b[67] = 0x20, 0, 0x10, 0 },
		"credits":       func(b []byte) { b[44], b[45] = 0, 0 },
		"slot":          func(b []byte) { b[46] = 63 },
		"volflags":      func(b []byte) { b[71] = 2 },
		"lock align":    func(b []byte) { b[63] = 4 },
		"grant count":   func(b []byte) { b[47] = 3 },
		"grant no stag": func(b []byte) { clear(b[WelcomeFixedLen : WelcomeFixedLen+4]) },
		"grant len 0":   func(b []byte) { clear(b[WelcomeFixedLen+4 : WelcomeFixedLen+8]) },
		"max transfer":  func(b []byte) { b[39] = 1 },
	}
	for name, mod := range bad {
		b := append([]byte(nil), m...)
		mod(b)
		if _, err := ParseWelcome(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := EncodeWelcome(make([]byte, MaxMessage), &WelcomeFields{Grants: make([]GrantFields, 17)}); err == nil {
		t.Fatal("17 grants encoded")
	}
}

func TestCommands(t *testing.T) {
	good := []CommandFields{
		{Op: OpRead, Tag: 3, Offset: 4096, Length: 8192},
		{Op: OpRead, Flags: FlagInline, Tag: 4, Offset: 512, Length: 4096},
		{Op: OpWrite, Flags: FlagFUA, Tag: 0x10005, Offset: 512, Length: 512, STag: 0x1234, Token: 99},
		{Op: OpFlush, Tag: 1},
		{Op: OpTrim, Offset: 0, Length: 1 << 30, Token: 1},
		{Op: OpWriteZeroes, Flags: FlagFUA, Offset: 1 << 40, Length: 4096},
		{Op: OpWriteZeroes, Flags: FlagNoHole, Offset: 4096, Length: 512, Token: 7},
		{Op: OpWriteZeroes, Flags: FlagFUA | FlagNoHole, Offset: 0, Length: 1 << 30},
		{Op: OpWriteReq, Offset: 0, Length: 1 << 20},
		{Op: OpRelease, STag: 0xdeadbe01},
		{Op: OpHolder, Offset: 62},
	}
	for _, f := range good {
		b := make([]byte, CommandLen)
		Command(b).Encode(&f)
		c, err := ParseCommand(b)
		if err != nil {
			t.Fatalf("%s: %v", f.Op, err)
		}
		if c.Fields() != f {
			t.Fatalf("%s: %+v != %+v", f.Op, c.Fields(), f)
		}
		if h, err := Check(b); err != nil || h.Opcode() != f.Op {
			t.Fatalf("Check %s: %v", f.Op, err)
		}
	}
	bad := []struct {
		f    CommandFields
		kind error
	}{
		{CommandFields{Op: OpRead, Length: 0}, ErrField},
		{CommandFields{Op: OpRead, Length: 1, Flags: FlagFUA}, ErrFlags},
		{CommandFields{Op: OpWriteReq, Length: 1, Flags: FlagInline}, ErrFlags},
		{CommandFields{Op: OpWrite, Length: 1, STag: 1, Flags: FlagInline}, ErrFlags},
		{CommandFields{Op: OpWrite, Length: 1, STag: 1, Flags: FlagNoHole}, ErrFlags},
		{CommandFields{Op: OpTrim, Length: 1, Flags: FlagNoHole}, ErrFlags},
		{CommandFields{Op: OpWriteZeroes, Length: 1, Flags: FlagInline}, ErrFlags},
		{CommandFields{Op: OpWriteZeroes, Length: 1, Flags: 0x10}, ErrFlags},
		{CommandFields{Op: OpRead, Length: 1, STag: 1}, ErrReserved},
		{CommandFields{Op: OpRead, Length: 1, Token: 1}, ErrReserved},
		{CommandFields{Op: OpWrite, Length: 1}, ErrField},
		{CommandFields{Op: OpFlush, Offset: 1}, ErrReserved},
		{CommandFields{Op: OpFlush, Flags: FlagFUA}, ErrFlags},
		{CommandFields{Op: OpRelease}, ErrField},
		{CommandFields{Op: OpRelease, STag: 1, Length: 1}, ErrReserved},
		{CommandFields{Op: OpHolder, Offset: 63}, ErrField},
		{CommandFields{Op: OpRead, Offset: ^uint64(0) - 10, Length: 512}, ErrField},
		{CommandFields{Op: OpResponse}, ErrOpcode},
		{CommandFields{Op: 0x19}, ErrOpcode},
		{CommandFields{Op: OpBlockStatus}, ErrField},
		{CommandFields{Op: OpBlockStatus, Length: 512, STag: 1}, ErrReserved},
		{CommandFields{Op: OpBlockStatus, Length: 512, Flags: FlagFUA}, ErrFlags},
	}
	for _, c := range bad {
		b := make([]byte, CommandLen)
		Command(b).Encode(&c.f)
		if _, err := ParseCommand(b); !errors.Is(err, c.kind) {
			t.Errorf("%+v: got %v, want %v", c.f, err, c.kind)
		}
	}
	b := make([]byte, CommandLen+1)
	Command(b).Encode(&good[0])
	if _, err := ParseCommand(b); !errors.Is(err, ErrLength) {
		t.Fatalf("33-byte command: %v", err)
	}
}

func TestResponses(t *testing.T) {
	f := ResponseFields{Op: OpResponse, Tag: 77, Status: StatusReserved, Value: uint64(Exclusive(4)),
		Grant: GrantFields{STag: 0x4501, Len: 4096}, Detail: "host-b"}
	m, err := EncodeResponse(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseResponse(m)
	if err != nil {
		t.Fatal(err)
	}
	if p.Fields() != f {
		t.Fatalf("%+v != %+v", p.Fields(), f)
	}
	// Long details are cut at a character boundary.
	long := strings.Repeat("é", 200)
	m, err = EncodeResponse(make([]byte, MaxMessage), &ResponseFields{Op: OpGoodbye, Status: StatusShutdown, Detail: long})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ParseResponse(m); err != nil || len(p.Detail()) != 254 {
		t.Fatalf("long detail: %v, %d bytes", err, len(m)-ResponseFixedLen)
	}
	// Control characters are replaced.
	m, _ = EncodeResponse(make([]byte, MaxMessage), &ResponseFields{Op: OpReject, Status: StatusAuth, Detail: "a\nb"})
	if p, err := ParseResponse(m); err != nil || string(p.Detail()) != "a?b" {
		t.Fatalf("sanitised detail: %v %q", err, m[ResponseFixedLen:])
	}
	if _, err := EncodeResponse(make([]byte, MaxMessage), &ResponseFields{Op: OpRead}); !errors.Is(err, ErrOpcode) {
		t.Fatalf("READ as a response: %v", err)
	}
	bad := map[string]ResponseFields{
		"reject ok":        {Op: OpReject, Status: StatusOK},
		"reject tag":       {Op: OpReject, Tag: 1, Status: StatusAuth},
		"goodbye grant":    {Op: OpGoodbye, Status: StatusShutdown, Grant: GrantFields{STag: 1, Len: 1}},
		"unknown status":   {Op: OpResponse, Status: 99},
		"grant len 0":      {Op: OpResponse, Grant: GrantFields{STag: 1}},
		"grant no stag":    {Op: OpResponse, Grant: GrantFields{Len: 1}},
		"grant wraps":      {Op: OpResponse, Grant: GrantFields{STag: 1, Len: 16, TO: ^uint64(0) - 2}},
		"response ok long": {Op: OpResponse, Status: StatusOK},
	}
	for name, f := range bad {
		m, err := EncodeResponse(make([]byte, MaxMessage), &f)
		if err != nil {
			t.Fatal(err)
		}
		if name == "response ok long" {
			m = append(m, 'x')
		}
		if _, err := ParseResponse(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReady(t *testing.T) {
	f := ReadyFields{Tag: 9, Buffer: GrantFields{STag: 0x77, Len: 4096, TO: 512}}
	m := EncodeReady(make([]byte, ReadyLen), &f)
	p, err := ParseReady(m)
	if err != nil || p.Fields() != f {
		t.Fatalf("%v %+v", err, p)
	}
	m.Buffer().Encode(&GrantFields{})
	if _, err := ParseReady(m); !errors.Is(err, ErrField) {
		t.Fatalf("READY without buffer: %v", err)
	}
}

func TestChallengeProof(t *testing.T) {
	var n [NonceLen]byte
	n[0] = 1
	c := EncodeChallenge(make([]byte, ChallengeLen), &n)
	if _, err := ParseChallenge(c); err != nil {
		t.Fatal(err)
	}
	c[9] = 2
	if _, err := ParseChallenge(c); !errors.Is(err, ErrField) {
		t.Fatalf("method 2: %v", err)
	}
	p := EncodeProof(make([]byte, ProofMsgLen), bytes.Repeat([]byte{7}, 32))
	if _, err := ParseProof(p); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseProof(p[:39]); !errors.Is(err, ErrShort) {
		t.Fatalf("short proof: %v", err)
	}
}

// TestProofs checks the proofs against an independent HMAC computation of
// the documented transcript, and that they bind every input.
func TestProofs(t *testing.T) {
	secret := []byte("correct horse battery staple")
	login := sampleLogin(t, false)
	var nt [NonceLen]byte
	nt[5] = 5
	ch := EncodeChallenge(make([]byte, ChallengeLen), &nt)
	got, err := InitiatorProof(secret, login, ch)
	if err != nil {
		t.Fatal(err)
	}
	h := hmac.New(sha256.New, secret)
	for _, part := range [][]byte{[]byte("rnic-block v1 initiator proof"), login, ch} {
		binary.Write(h, binary.BigEndian, uint32(len(part)))
		h.Write(part)
	}
	if want := h.Sum(nil); !bytes.Equal(got[:], want) {
		t.Fatalf("initiator proof %x, want %x", got, want)
	}
	if other, _ := InitiatorProof([]byte("wrong"), login, ch); ProofEqual(other[:], got[:]) {
		t.Fatal("proof does not depend on the secret")
	}
	ch2 := EncodeChallenge(make([]byte, ChallengeLen), &[NonceLen]byte{1})
	if other, _ := InitiatorProof(secret, login, ch2); ProofEqual(other[:], got[:]) {
		t.Fatal("proof does not depend on the target nonce")
	}
	if _, err := InitiatorProof(nil, login, ch); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("empty secret: %v", err)
	}

	pr := EncodeProof(make([]byte, ProofMsgLen), got[:])
	w := sampleWelcome(t)
	tp, err := TargetProof(secret, login, ch, pr, w)
	if err != nil {
		t.Fatal(err)
	}
	zeroed := append([]byte(nil), w...)
	clear(zeroed[72:104])
	h = hmac.New(sha256.New, secret)
	for _, part := range [][]byte{[]byte("rnic-block v1 target proof"), login, ch, pr, zeroed} {
		binary.Write(h, binary.BigEndian, uint32(len(part)))
		h.Write(part)
	}
	if want := h.Sum(nil); !bytes.Equal(tp[:], want) {
		t.Fatalf("target proof %x, want %x", tp, want)
	}
	// The proof field itself does not change the proof; other fields do.
	w[80] ^= 1
	if tp2, _ := TargetProof(secret, login, ch, pr, w); tp2 != tp {
		t.Fatal("target proof covers its own field")
	}
	w[30] ^= 1
	if tp2, _ := TargetProof(secret, login, ch, pr, w); tp2 == tp {
		t.Fatal("target proof does not cover the volume size")
	}
	if ProofEqual(tp[:], got[:]) {
		t.Fatal("target and initiator proofs coincide")
	}
}

func TestReservation(t *testing.T) {
	var r Reservation
	if !r.Free() || !r.WriteAllowed(3) {
		t.Fatal("free reservation")
	}
	r = Exclusive(3)
	if uint64(r) != 1<<63|1<<3 || !r.IsExclusive() || !r.Holds(3) || r.Holds(4) {
		t.Fatalf("exclusive %x", uint64(r))
	}
	if !r.WriteAllowed(3) || r.WriteAllowed(4) {
		t.Fatal("exclusive write rule")
	}
	if s, ok := r.FirstHolder(); !ok || s != 3 {
		t.Fatal("first holder")
	}
	if r.Without(3) != 0 || r.Without(4) != r {
		t.Fatal("Without on exclusive")
	}
	sh := Reservation(SlotBit(1) | SlotBit(62))
	if sh.IsExclusive() || sh.WriteAllowed(1) || sh.WriteAllowed(5) {
		t.Fatal("shared forbids writes")
	}
	if sh.Without(1) != Reservation(SlotBit(62)) || sh.Without(1).Without(62) != 0 {
		t.Fatal("Without on shared")
	}
	if s, _ := sh.FirstHolder(); s != 1 {
		t.Fatal("first shared holder")
	}
}

func TestLockWords(t *testing.T) {
	v := LockValue(0, 12345)
	if s, ok := LockHolder(v); !ok || s != 0 || v>>56 != 1 {
		t.Fatalf("lock word %x", v)
	}
	v = LockValue(62, ^uint64(0))
	if s, ok := LockHolder(v); !ok || s != 62 || v != 63<<56|(1<<56-1) {
		t.Fatalf("lock word %x", v)
	}
	if _, ok := LockHolder(0); ok {
		t.Fatal("0 is held")
	}
	if _, ok := LockHolder(64 << 56); ok {
		t.Fatal("slot 63 accepted")
	}
	if LockTableLen(4) != 96 || LockOffset(0) != 64 || WordOffset(WordGeneration) != 8 {
		t.Fatal("table layout")
	}
	for _, c := range []struct {
		tok, floor, gen uint64
		stale           bool
	}{{0, 5, 9, false}, {5, 5, 9, true}, {6, 5, 9, false}, {9, 5, 9, false}, {10, 5, 9, true}, {1, 0, 1, false}} {
		if Stale(c.tok, c.floor, c.gen) != c.stale {
			t.Errorf("Stale(%d, %d, %d) != %v", c.tok, c.floor, c.gen, c.stale)
		}
	}
}

func TestHeader(t *testing.T) {
	if _, err := ParseHeader(make([]byte, MaxMessage+1)); !errors.Is(err, ErrLength) {
		t.Fatal("oversized message accepted")
	}
	b := make([]byte, 8)
	Header(b).Encode(&HeaderFields{Opcode: 0x7f})
	if _, err := ParseHeader(b); !errors.Is(err, ErrOpcode) {
		t.Fatal("unknown opcode accepted")
	}
	if v, op, ok := PeekOpcode([]byte{9, 1, 0, 0, 0, 0, 0, 0}); !ok || v != 9 || op != OpLogin {
		t.Fatal("PeekOpcode")
	}
	if Opcode(0x7f).String() != "opcode(0x7f)" || OpWriteZeroes.String() != "WRITE_ZEROES" {
		t.Fatal("opcode names")
	}
	if Status(99).String() != "status(99)" || StatusStaleToken.String() != "stale fencing token" {
		t.Fatal("status names")
	}
}

// TestMaxSizes: the largest message of every kind fits MaxMessage.
func TestMaxSizes(t *testing.T) {
	long := strings.Repeat("n", MaxName)
	m, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 1, Initiator: long, Volume: long})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseLogin(m); err != nil {
		t.Fatal(err)
	}
	w, err := EncodeWelcome(make([]byte, MaxMessage), &WelcomeFields{SessionID: 1, VolumeSize: 4096, MaxTransfer: 4096,
		Credits: 1, MinIO: 512, PreferredIO: 4096, Grants: make([]GrantFields, MaxWelcomeGrants)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxWelcomeGrants {
		w.Grant(i).Encode(&GrantFields{STag: uint32(i + 1), Len: 4096})
	}
	if _, err := ParseWelcome(w); err != nil {
		t.Fatal(err)
	}
	wi, err := EncodeWelcome(make([]byte, MaxMessage), &WelcomeFields{SessionID: 1, VolumeSize: 4096, MaxTransfer: 4096,
		Credits: 1, MinIO: 512, PreferredIO: 4096, Inline: MaxInline, Grants: make([]GrantFields, MaxWelcomeGrants)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxWelcomeGrants {
		wi.Grant(i).Encode(&GrantFields{STag: uint32(i + 1), Len: 4096})
	}
	if _, err := ParseWelcome(wi); err != nil {
		t.Fatal(err)
	}
	d, err := EncodeData(make([]byte, DataLen(MaxInline)), &DataFields{Tag: 1, Len: MaxInline})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Check(d); err != nil || len(d) != DataFixedLen+MaxInline {
		t.Fatalf("largest DATA: %v", err)
	}
	r, _ := EncodeResponse(make([]byte, MaxMessage), &ResponseFields{Op: OpResponse, Detail: long})
	for _, n := range []int{len(m), len(w), len(wi), len(r), CommandLen, ReadyLen, ChallengeLen, ProofMsgLen} {
		if n > MaxMessage {
			t.Fatalf("message of %d bytes > MaxMessage", n)
		}
	}
}

// TestInlineLogin pins the LOGIN's inline field (FlagInline, bytes 12-15).
func TestInlineLogin(t *testing.T) {
	f := LoginFields{Credits: 8, Inline: 8192, Initiator: "h", Volume: "v"}
	m, err := EncodeLogin(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(m[:16]); got != "0101000200000000"+"0008010100002000" {
		t.Fatalf("LOGIN head %s", got)
	}
	p, err := ParseLogin(m)
	if err != nil || p.Fields() != f || p.Inline() != 8192 {
		t.Fatalf("%v %+v", err, p.Fields())
	}
	// Without the flag the field is reserved.
	b := append([]byte(nil), m...)
	b[3] = 0
	if _, err := ParseLogin(b); !errors.Is(err, ErrReserved) {
		t.Fatalf("size without FlagInline: %v", err)
	}
	for _, n := range []uint32{100, MaxInline + 512} {
		if _, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 1, Inline: n, Initiator: "h", Volume: "v"}); !errors.Is(err, ErrField) {
			t.Errorf("inline %d encoded: %v", n, err)
		}
	}
}

func TestWelcomeInline(t *testing.T) {
	f := sampleWelcome(t).Fields()
	f.Inline = 4096
	m, err := EncodeWelcome(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != WelcomeInlineLen+2*GrantLen || Header(m).Flags() != FlagInline {
		t.Fatalf("length %d flags %#x", len(m), Header(m).Flags())
	}
	p, err := ParseWelcome(m)
	if err != nil {
		t.Fatal(err)
	}
	g := p.Fields()
	if g.Inline != 4096 || len(g.Grants) != 2 || g.Grants[1] != f.Grants[1] {
		t.Fatalf("fields %+v", g)
	}
	// Without FlagInline a WELCOME is laid out as before.
	f.Inline = 0
	plain, _ := EncodeWelcome(make([]byte, MaxMessage), &f)
	if !bytes.Equal(plain, sampleWelcome(t)) {
		t.Fatal("WELCOME without inline changed")
	}
	bad := map[string]func(b []byte) []byte{
		"inline 0":         func(b []byte) []byte { clear(b[104:108]); return b },
		"inline unaligned": func(b []byte) []byte { b[107] = 1; return b },
		"inline too large": func(b []byte) []byte { b[105] = 1; return b },
		"reserved":         func(b []byte) []byte { b[111] = 1; return b },
		"flag cleared":     func(b []byte) []byte { b[3] = 0; return b },
		"unknown flag":     func(b []byte) []byte { b[3] = 3; return b },
		"short":            func(b []byte) []byte { b[47] = 0; return b[:110] },
	}
	for name, mod := range bad {
		if _, err := ParseWelcome(mod(append([]byte(nil), m...))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := EncodeWelcome(make([]byte, MaxMessage), &WelcomeFields{MinIO: 4096, Inline: 512}); !errors.Is(err, ErrField) {
		t.Fatalf("inline below min I/O: %v", err)
	}
}

func TestData(t *testing.T) {
	f := DataFields{Tag: 0x20003, Grant: GrantFields{STag: 0x99, Len: 4096}, Len: 1024}
	b := make([]byte, DataLen(MaxInline))
	m, err := EncodeData(b, &f)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Payload() {
		m.Payload()[i] = byte(i)
	}
	want := "01230000 00020003" + "00000099 00001000 0000000000000000" + "00000400 00000000"
	if got := hex.EncodeToString(m[:DataFixedLen]); got != strings.ReplaceAll(want, " ", "") {
		t.Fatalf("DATA head %s", got)
	}
	p, err := ParseData(m)
	if err != nil || p.Fields() != f || len(p.Payload()) != 1024 || p.Payload()[1023] != byte(1023&0xff) {
		t.Fatalf("%v %+v", err, p.Fields())
	}
	if h, err := Check(m); err != nil || h.Opcode() != OpData || OpData.String() != "DATA" {
		t.Fatalf("Check: %v", err)
	}
	cases := []struct {
		name string
		mod  func(b []byte) []byte
		kind error
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrShort},
		{"trailing", func(b []byte) []byte { return append(b, 0) }, ErrLength},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, ErrLength},
		{"length 0", func(b []byte) []byte { clear(b[24:28]); return b[:DataFixedLen] }, ErrField},
		{"length above max", func(b []byte) []byte { b[25] = 1; return b }, ErrField},
		{"flags", func(b []byte) []byte { b[3] = 2; return b }, ErrFlags},
		{"reserved", func(b []byte) []byte { b[30] = 1; return b }, ErrReserved},
		{"grant no stag", func(b []byte) []byte { clear(b[8:12]); return b }, ErrReserved},
		{"grant len 0", func(b []byte) []byte { clear(b[12:16]); return b }, ErrField},
		{"opcode", func(b []byte) []byte { b[1] = OpReady.u8(); return b[:ReadyLen] }, ErrOpcode},
	}
	for _, c := range cases {
		_, err := ParseData(c.mod(append([]byte(nil), m...)))
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.kind)
		}
	}
	// Only a DATA may exceed MaxMessage, and by at most MaxInline.
	big, _ := EncodeData(make([]byte, DataLen(MaxInline)), &DataFields{Len: MaxInline})
	if _, err := ParseHeader(append(big, 0)); !errors.Is(err, ErrLength) {
		t.Fatalf("oversized DATA: %v", err)
	}
	r := make([]byte, MaxMessage+1)
	Header(r).Encode(&HeaderFields{Opcode: OpResponse})
	if _, err := ParseHeader(r); !errors.Is(err, ErrLength) {
		t.Fatalf("oversized RESPONSE: %v", err)
	}
	for _, n := range []uint32{0, MaxInline + 1} {
		if _, err := EncodeData(b, &DataFields{Len: n}); !errors.Is(err, ErrField) {
			t.Errorf("DATA of %d encoded: %v", n, err)
		}
	}
	if _, err := EncodeData(make([]byte, 40), &DataFields{Len: 512}); !errors.Is(err, ErrShort) {
		t.Fatalf("short buffer: %v", err)
	}
}

func TestExtents(t *testing.T) {
	f := ExtentsFields{Tag: 7, Grant: GrantFields{STag: 2, Len: 4096},
		Extents: []ExtentFields{{Length: 4096, Flags: ExtentHole | ExtentZero}, {Length: 8192}}}
	good, err := EncodeExtents(make([]byte, MaxMessage), &f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseExtents(good, 512)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Fields(); got.Tag != 7 || len(got.Extents) != 2 || got.Extents[0] != f.Extents[0] || got.Extents[1] != f.Extents[1] ||
		got.Grant != f.Grant {
		t.Fatalf("round trip: %+v", got)
	}
	if _, err := EncodeExtents(make([]byte, MaxMessage), &ExtentsFields{Extents: make([]ExtentFields, MaxExtents+1)}); !errors.Is(err, ErrField) {
		t.Fatalf("encoding %d descriptors: %v", MaxExtents+1, err)
	}
	if ExtentsLen(MaxExtents) > MaxMessage {
		t.Fatalf("MaxExtents descriptors take %d bytes, more than MaxMessage", ExtentsLen(MaxExtents))
	}
	cases := []struct {
		name string
		mod  func(b []byte) []byte
		kind error
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrShort},
		{"trailing", func(b []byte) []byte { return append(b, 0) }, ErrLength},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, ErrLength},
		{"count 0", func(b []byte) []byte { clear(b[24:28]); return b[:ExtentsFixedLen] }, ErrField},
		{"count above max", func(b []byte) []byte { b[26] = 1; return b }, ErrField},
		{"flags", func(b []byte) []byte { b[3] = 2; return b }, ErrFlags},
		{"reserved", func(b []byte) []byte { b[30] = 1; return b }, ErrReserved},
		{"extent length 0", func(b []byte) []byte { clear(b[32:36]); return b }, ErrField},
		{"extent unaligned", func(b []byte) []byte { b[35] = 1; return b }, ErrField},
		{"extent flags", func(b []byte) []byte { b[39] = 4; return b }, ErrFlags},
		{"sum overflows", func(b []byte) []byte {
			copy(b[32:36], []byte{0xff, 0xff, 0xfe, 0})
			copy(b[40:44], []byte{0xff, 0xff, 0xfe, 0})
			return b
		}, ErrField},
		{"grant len 0", func(b []byte) []byte { clear(b[12:16]); return b }, ErrField},
		{"opcode", func(b []byte) []byte { b[1] = OpData.u8(); return b }, ErrOpcode},
	}
	for _, c := range cases {
		b := c.mod(append([]byte(nil), good...))
		_, err := ParseExtents(b, 512)
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.kind)
		}
	}
}

// TestNoHole pins FlagNoHole: bit 0x8 of the header in a LOGIN and a
// WELCOME (both decoded into NoHole and encoded back), and on a
// WRITE_ZEROES, where Command.NoHole reports it; on any other command it
// is an unknown flag.
func TestNoHole(t *testing.T) {
	lm, err := EncodeLogin(make([]byte, MaxMessage), &LoginFields{Credits: 4, Extents: true, NoHole: true, Initiator: "i", Volume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	if Header(lm).Flags() != FlagExtents|0x8 {
		t.Fatalf("LOGIN flags %#x, want FlagExtents|0x8", Header(lm).Flags())
	}
	pl, err := ParseLogin(lm)
	if err != nil || !pl.NoHole() || !pl.Fields().NoHole || !pl.Extents() {
		t.Fatalf("LOGIN with FlagNoHole: %v, NoHole %v", err, err == nil && pl.NoHole())
	}
	if pl, err := ParseLogin(sampleLogin(t, false)); err != nil || pl.NoHole() {
		t.Fatalf("LOGIN without FlagNoHole: %v, NoHole %v", err, err == nil && pl.NoHole())
	}
	wf := sampleWelcome(t).Fields()
	wf.NoHole = true
	wm, err := EncodeWelcome(make([]byte, MaxMessage), &wf)
	if err != nil {
		t.Fatal(err)
	}
	if Header(wm).Flags() != 0x8 || len(wm) != WelcomeFixedLen+2*GrantLen {
		t.Fatalf("WELCOME flags %#x, %d bytes", Header(wm).Flags(), len(wm))
	}
	pw, err := ParseWelcome(wm)
	if err != nil || !pw.Fields().NoHole {
		t.Fatalf("WELCOME with FlagNoHole: %v", err)
	}
	if pw, _ := ParseWelcome(sampleWelcome(t)); pw.Fields().NoHole {
		t.Fatal("a WELCOME without FlagNoHole decodes with NoHole")
	}
	b := make([]byte, CommandLen)
	Command(b).Encode(&CommandFields{Op: OpWriteZeroes, Flags: FlagNoHole, Length: 4096})
	if b[2] != 0 || b[3] != 0x8 {
		t.Fatalf("WRITE_ZEROES flags bytes %x", b[2:4])
	}
	if c, err := ParseCommand(b); err != nil || !c.NoHole() || c.FUA() {
		t.Fatalf("WRITE_ZEROES with FlagNoHole: %v", err)
	}
	Command(b).Encode(&CommandFields{Op: OpWriteZeroes, Flags: FlagFUA, Length: 4096})
	if c, err := ParseCommand(b); err != nil || c.NoHole() {
		t.Fatalf("WRITE_ZEROES without FlagNoHole: %v, NoHole %v", err, err == nil && c.NoHole())
	}
}
