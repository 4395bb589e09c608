package nbd

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The vectors are written out from the layouts in the NBD specification
// (doc/proto.md), independently of the encoders.
func TestWireVectors(t *testing.T) {
	t.Run("greeting", func(t *testing.T) {
		b := make([]byte, GreetingSize)
		Greeting(b).Encode(protocol.NegotiationNewstyleHeader{OldstyleMagic: magicInit, OptionMagic: magicOption, HandshakeFlags: 3})
		if want := append([]byte("NBDMAGICIHAVEOPT"), 0, 3); !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
	})
	t.Run("option", func(t *testing.T) {
		b := make([]byte, OptionSize)
		Option(b).Encode(protocol.NegotiationOptionHeader{OptionMagic: magicOption, ID: OptGo, Length: 0x0102})
		want := append([]byte("IHAVEOPT"), unhex(t, "00000007 00000102")...)
		if !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
		o := Option(want)
		if o.Magic() != magicOption || o.ID() != OptGo || o.Length() != 0x102 {
			t.Fatalf("decoded %#x %d %d", o.Magic(), o.ID(), o.Length())
		}
	})
	t.Run("option reply", func(t *testing.T) {
		b := make([]byte, OptionReplySize)
		OptionReply(b).Encode(protocol.NegotiationReplyHeader{ReplyMagic: magicOptionReply, ID: OptList, Type: RepErrUnsup, Length: 5})
		want := unhex(t, "0003e889045565a9 00000003 80000001 00000005")
		if !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
		r := OptionReply(want)
		if r.Magic() != magicOptionReply || r.Option() != OptList || r.Type() != RepErrUnsup || r.Length() != 5 {
			t.Fatal("decode mismatch")
		}
	})
	t.Run("info export", func(t *testing.T) {
		b := make([]byte, InfoExportSize)
		InfoExport(b).Encode(protocol.NegotiationReplyInfo{Type: InfoTypeExport, Size: 1 << 30, TransmissionFlags: 0x016d})
		if want := unhex(t, "0000 0000000040000000 016d"); !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
	})
	t.Run("info block size", func(t *testing.T) {
		b := make([]byte, InfoBlockSizeSize)
		InfoBlockSize(b).Encode(protocol.NegotiationReplyBlockSize{Type: InfoTypeBlockSize, MinimumBlockSize: 512, PreferredBlockSize: 4096, MaximumBlockSize: 32 << 20})
		if want := unhex(t, "0003 00000200 00001000 02000000"); !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
	})
	t.Run("request", func(t *testing.T) {
		want := unhex(t, "25609513 0001 0006 0102030405060708 0000000000001000 00000200")
		r := Request(want)
		f := r.Fields()
		if f.RequestMagic != magicRequest || f.CommandFlags != CmdFlagFUA || f.Type != CmdWriteZeroes ||
			f.Handle != 0x0102030405060708 || f.Offset != 4096 || f.Length != 512 {
			t.Fatalf("decoded %+v", f)
		}
		b := make([]byte, RequestSize)
		Request(b).Encode(f)
		if !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
	})
	t.Run("simple reply", func(t *testing.T) {
		b := make([]byte, SimpleReplySize)
		SimpleReply(b).Encode(protocol.TransmissionReplyHeader{ReplyMagic: magicSimpleReply, Error: EINVAL, Handle: 0xfedcba9876543210})
		if want := unhex(t, "67446698 00000016 fedcba9876543210"); !bytes.Equal(b, want) {
			t.Fatalf("% x\nwant % x", b, want)
		}
		r := SimpleReply(b)
		if r.Magic() != magicSimpleReply || r.Error() != EINVAL || r.Cookie() != 0xfedcba9876543210 {
			t.Fatal("decode mismatch")
		}
	})
}

func TestParseInfoRequest(t *testing.T) {
	good := []struct {
		in   string
		want InfoRequest
	}{
		{"00000000 0000", InfoRequest{}},
		{"00000003 616263 0002 0003 0001", InfoRequest{Name: "abc", Infos: []uint16{3, 1}}},
	}
	for _, tc := range good {
		got, err := ParseInfoRequest(unhex(t, tc.in))
		if err != nil || got.Name != tc.want.Name || !slices.Equal(got.Infos, tc.want.Infos) {
			t.Errorf("%s: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if enc := AppendInfoRequest(nil, tc.want); !bytes.Equal(enc, unhex(t, tc.in)) {
			t.Errorf("encode %+v: % x", tc.want, enc)
		}
	}
	for _, in := range []string{
		"",
		"0000000000",           // 5 bytes
		"00000001 0000",        // name runs into the count
		"ffffffff 0000",        // huge name length
		"00000000 0001",        // one request missing
		"00000000 0000 00",     // trailing byte
		"00000000 0001 000300", // odd trailing
		"00001001" + strings.Repeat("61", 4097) + "0000", // name longer than 4096
	} {
		if _, err := ParseInfoRequest(unhex(t, in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", in, err)
		}
	}
}

func FuzzParseInfoRequest(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0})
	f.Add(AppendInfoRequest(nil, InfoRequest{Name: "vol", Infos: []uint16{InfoTypeBlockSize, InfoTypeName, InfoTypeDescription}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 'a', 0, 2, 0, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseInfoRequest(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// A successful parse re-encodes to exactly the input.
		if enc := AppendInfoRequest(nil, r); !bytes.Equal(enc, data) {
			t.Fatalf("re-encoded % x, input % x", enc, data)
		}
	})
}

func FuzzRequest(f *testing.F) {
	f.Add([]byte("\x25\x60\x95\x13\x00\x01\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x02\x00"))
	f.Add(make([]byte, RequestSize))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < RequestSize {
			return
		}
		r := Request(data[:RequestSize])
		f := r.Fields()
		b := make([]byte, RequestSize)
		Request(b).Encode(f)
		if !bytes.Equal(b, data[:RequestSize]) {
			t.Fatalf("round trip % x -> % x", data[:RequestSize], b)
		}
		// check never panics and answers only defined values.
		exp := Export{Backend: newMem(0)}.withDefaults()
		req := &request{typ: f.Type, flags: f.CommandFlags, cookie: f.Handle, off: f.Offset, length: f.Length}
		switch e := check(selected{exp: exp, size: 1 << 20, structured: true, metaAlloc: f.Offset%2 == 0}, req); e {
		case 0, EINVAL, ENOSPC, EPERM:
		default:
			t.Fatalf("check returned %d", e)
		}
	})
}
