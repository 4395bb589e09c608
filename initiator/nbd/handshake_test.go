package nbd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

func twoExports() (*Server, *memBackend, *memBackend) {
	a, b := newMem(1<<20), newMem(2<<20)
	return &Server{Exports: []Export{
		{Name: "a", Description: "export A", Backend: a, MultiConn: true},
		{Name: "b", Description: "export B", Backend: b, ReadOnly: true, MinBlock: 4096, PrefBlock: 4096, MaxBlock: 1 << 20},
	}}, a, b
}

func TestHandshakeGo(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	res := c.info(OptGo, "a", InfoTypeBlockSize, InfoTypeName, InfoTypeDescription)
	if res.final != RepAck {
		t.Fatalf("final reply %#x %q", res.final, res.errMsg)
	}
	want := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn
	if !res.haveExport || res.size != 1<<20 || res.flags != want {
		t.Errorf("NBD_INFO_EXPORT: have %v size %d flags %#x, want size %d flags %#x", res.haveExport, res.size, res.flags, 1<<20, want)
	}
	if !res.haveBlock || res.min != 512 || res.pref != 4096 || res.max != 32<<20 {
		t.Errorf("NBD_INFO_BLOCK_SIZE: have %v %d/%d/%d, want 512/4096/%d", res.haveBlock, res.min, res.pref, res.max, 32<<20)
	}
	if !res.haveName || res.name != "a" || !res.haveDesc || res.desc != "export A" {
		t.Errorf("name %v %q, description %v %q", res.haveName, res.name, res.haveDesc, res.desc)
	}
	if res.unexpectedInfoReplies != 0 {
		t.Errorf("%d unknown NBD_REP_INFO replies", res.unexpectedInfoReplies)
	}
	// Transmission works.
	if r := c.do(CmdRead, 0, 0, 4096, nil); r.errno != 0 || len(r.data) != 4096 {
		t.Fatalf("read: errno %d, %d bytes", r.errno, len(r.data))
	}
	c.send(CmdDisc, 0, 1, 0, 0, nil)
	s.expectEnd(t, c, nil)
}

func TestHandshakeReadOnlyExportFlags(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	res := c.info(OptInfo, "b")
	if res.final != RepAck {
		t.Fatalf("final reply %#x %q", res.final, res.errMsg)
	}
	if res.flags != FlagHasFlags|FlagReadOnly || res.size != 2<<20 {
		t.Errorf("flags %#x size %d, want %#x %d", res.flags, res.size, FlagHasFlags|FlagReadOnly, 2<<20)
	}
	if res.min != 4096 || res.pref != 4096 || res.max != 1<<20 {
		t.Errorf("block sizes %d/%d/%d", res.min, res.pref, res.max)
	}
	if res.haveName || res.haveDesc {
		t.Errorf("name/description sent though not requested")
	}
}

// An NBD_OPT_INFO for one export followed by NBD_OPT_GO for an unknown one
// must fail the GO (go-nbd v0.3.2 enters transmission with the first).
func TestHandshakeInfoThenUnknownGo(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	if res := c.info(OptInfo, "a"); res.final != RepAck || res.size != 1<<20 {
		t.Fatalf("INFO a: %#x size %d", res.final, res.size)
	}
	res := c.info(OptGo, "nope")
	if res.final != RepErrUnknown || res.haveExport {
		t.Fatalf("GO nope: final %#x (want NBD_REP_ERR_UNKNOWN), export info %v", res.final, res.haveExport)
	}
	if res.errMsg == "" {
		t.Error("error reply without message")
	}
	if res := c.goExport("b"); res.size != 2<<20 {
		t.Fatalf("GO b: size %d", res.size)
	}
	if r := c.do(CmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatalf("read: errno %d", r.errno)
	}
}

func TestHandshakeDefaultExport(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	res := c.info(OptGo, "")
	if res.final != RepAck || res.size != 1<<20 {
		t.Fatalf("GO \"\": %#x size %d", res.final, res.size)
	}
	if !res.haveName || res.name != "a" {
		t.Errorf("canonical name: have %v %q, want \"a\"", res.haveName, res.name)
	}
}

func TestHandshakeExportName(t *testing.T) {
	for _, noZeroes := range []bool{false, true} {
		srv, a, _ := twoExports()
		copy(a.data, pattern(4096, 3))
		s := serve(t, srv)
		flags := clientFlagFixedNewstyle
		if noZeroes {
			flags |= clientFlagNoZeroes
		}
		c := dial(t, s.addr, flags)
		c.option(OptExportName, []byte("a"))
		n := ExportNameReplySize + exportNameZeroes
		if noZeroes {
			n = ExportNameReplySize
		}
		b := make([]byte, n)
		c.readFull(b)
		size, tf := binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:])
		if size != 1<<20 || tf&FlagHasFlags == 0 || tf&FlagSendFlush == 0 {
			t.Fatalf("no_zeroes=%v: size %d flags %#x", noZeroes, size, tf)
		}
		if !bytes.Equal(b[10:], make([]byte, n-10)) {
			t.Fatalf("reserved bytes not zero")
		}
		// The next bytes are transmission replies, not leftover padding.
		r := c.do(CmdRead, 0, 0, 4096, nil)
		if r.errno != 0 || !bytes.Equal(r.data, pattern(4096, 3)) {
			t.Fatalf("no_zeroes=%v: read errno %d / wrong data", noZeroes, r.errno)
		}
	}
}

func TestHandshakeExportNameUnknownCloses(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.option(OptExportName, []byte("nope"))
	s.expectEnd(t, c, ErrProtocol)
}

func TestHandshakeList(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.option(OptList, nil)
	var names, descs []string
	for {
		r := c.optReply()
		if r.option != OptList {
			t.Fatalf("reply for option %d", r.option)
		}
		if r.typ == RepAck {
			break
		}
		if r.typ != RepServer {
			t.Fatalf("reply type %#x", r.typ)
		}
		n := binary.BigEndian.Uint32(r.data)
		if int(n) > len(r.data)-4 {
			t.Fatalf("name length %d in %d bytes", n, len(r.data))
		}
		names = append(names, string(r.data[4:4+n]))
		descs = append(descs, string(r.data[4+n:]))
	}
	if len(names) != 2 || names[0] != "a" || names[1] != "b" || descs[0] != "export A" || descs[1] != "export B" {
		t.Fatalf("list: %q %q", names, descs)
	}
	// NBD_OPT_LIST with data is invalid, and the data is consumed.
	c.option(OptList, []byte("xyz"))
	if r := c.optReply(); r.typ != RepErrInvalid {
		t.Fatalf("LIST with data: %#x", r.typ)
	}
	c.goExport("a")
}

func TestHandshakeAbort(t *testing.T) {
	// The specification: the server SHOULD ignore data sent with
	// NBD_OPT_ABORT and MUST reply with NBD_REP_ACK; with data longer
	// than the server reads for an option (maxOptionData) too.
	for _, n := range []int{0, 3, maxOptionData + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			srv, _, _ := twoExports()
			s := serve(t, srv)
			c := dial(t, s.addr, clientFlagFixedNewstyle)
			c.option(OptAbort, make([]byte, n))
			if r := c.optReply(); r.option != OptAbort || r.typ != RepAck {
				t.Fatalf("abort with %d bytes of data: reply %d %#x, want ACK", n, r.option, r.typ)
			}
			s.expectEnd(t, c, nil)
		})
	}
}

func TestHandshakeUnsupportedOptions(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	for _, o := range []struct {
		id   uint32
		data []byte
	}{
		{OptStartTLS, nil},
		{OptExtendedHeaders, nil},
		{4242, []byte("some data the server must skip")},
	} {
		c.option(o.id, o.data)
		if r := c.optReply(); r.option != o.id || r.typ != RepErrUnsup {
			t.Fatalf("option %d: reply %d %#x, want NBD_REP_ERR_UNSUP", o.id, r.option, r.typ)
		}
	}
	c.goExport("a")
	if r := c.do(CmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatalf("flush: %d", r.errno)
	}
}

func TestHandshakeMalformed(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	for _, data := range [][]byte{
		{0, 0, 0},                         // too short
		{0, 0, 0, 9, 'a', 0, 0},           // name longer than the data
		{0, 0, 0, 1, 'a', 0, 2, 0, 3},     // two info requests, one present
		{0, 0, 0, 1, 'a', 0, 0, 0, 3, 99}, // trailing bytes
	} {
		c.option(OptGo, data)
		if r := c.optReply(); r.typ != RepErrInvalid {
			t.Fatalf("GO % x: reply %#x, want NBD_REP_ERR_INVALID", data, r.typ)
		}
	}
	// Oversized option data is skipped and refused.
	c.option(OptInfo, make([]byte, maxOptionData+1))
	if r := c.optReply(); r.typ != RepErrTooBig {
		t.Fatalf("oversized INFO: reply %#x, want NBD_REP_ERR_TOO_BIG", r.typ)
	}
	c.goExport("a")
}

func TestHandshakeViolations(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)

	c := dial(t, s.addr, 1<<5) // unknown client flag
	s.expectEnd(t, c, ErrProtocol)

	c = dial(t, s.addr, clientFlagFixedNewstyle)
	c.write(make([]byte, OptionSize)) // option with magic 0
	s.expectEnd(t, c, ErrProtocol)
}
