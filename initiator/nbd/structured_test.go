package nbd

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// chunk is one structured reply chunk.
type chunk struct {
	flags, typ uint16
	cookie     uint64
	payload    []byte
}

// chunk reads the next structured reply chunk.
func (c *rawClient) chunk() chunk {
	c.t.Helper()
	var h [StructuredReplySize]byte
	c.readFull(h[:])
	r := StructuredReply(h[:])
	if r.Magic() != 0x668e33ef {
		c.t.Fatalf("structured reply magic %#x", r.Magic())
	}
	if r.Length() > 64<<20 {
		c.t.Fatalf("chunk of %d bytes", r.Length())
	}
	out := chunk{flags: r.Flags(), typ: r.Type(), cookie: r.Cookie(), payload: make([]byte, r.Length())}
	c.readFull(out.payload)
	return out
}

// metaOption sends a meta context option and returns the contexts
// replied (ID, name) and the final reply type.
func (c *rawClient) metaOption(id uint32, name string, queries ...string) (map[string]uint32, uint32) {
	c.t.Helper()
	c.option(id, AppendMetaContextRequest(nil, MetaContextRequest{Name: name, Queries: queries}))
	got := map[string]uint32{}
	for {
		r := c.optReply()
		if r.typ != RepMetaContext {
			return got, r.typ
		}
		if len(r.data) < 4 {
			c.t.Fatalf("NBD_REP_META_CONTEXT of %d bytes", len(r.data))
		}
		got[string(r.data[4:])] = binary.BigEndian.Uint32(r.data)
	}
}

// descriptors decodes a BLOCK_STATUS chunk's payload.
func descriptors(t *testing.T, ch chunk) (uint32, [][2]uint32) {
	t.Helper()
	if ch.typ != ReplyTypeBlockStatus || ch.flags != ReplyFlagDone || len(ch.payload) < 12 || (len(ch.payload)-4)%8 != 0 {
		t.Fatalf("BLOCK_STATUS reply: type %d flags %d payload %d bytes", ch.typ, ch.flags, len(ch.payload))
	}
	var out [][2]uint32
	for p := ch.payload[4:]; len(p) > 0; p = p[8:] {
		out = append(out, [2]uint32{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])})
	}
	return binary.BigEndian.Uint32(ch.payload), out
}

// TestMetaContextNegotiation: structured replies first, then listing and
// selecting base:allocation, which only exports with a BlockStatuser
// offer.
func TestMetaContextNegotiation(t *testing.T) {
	srv, _, _ := twoExports()
	srv.Exports = append(srv.Exports, Export{Name: "plain", Backend: plainBackend{newMem(1 << 20)}})
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	if _, typ := c.metaOption(OptSetMetaContext, "a", MetaBaseAllocation); typ != RepErrInvalid {
		t.Fatalf("SET_META_CONTEXT before STRUCTURED_REPLY: %#x, want NBD_REP_ERR_INVALID", typ)
	}
	c.option(OptStructuredReply, []byte{1})
	if r := c.optReply(); r.typ != RepErrInvalid {
		t.Fatalf("STRUCTURED_REPLY with data: %#x", r.typ)
	}
	c.option(OptStructuredReply, nil)
	if r := c.optReply(); r.typ != RepAck {
		t.Fatalf("STRUCTURED_REPLY: %#x", r.typ)
	}
	for _, q := range [][]string{nil, {"base:"}, {MetaBaseAllocation}, {"other:x", MetaBaseAllocation}} {
		got, typ := c.metaOption(OptListMetaContext, "a", q...)
		if typ != RepAck || len(got) != 1 || got[MetaBaseAllocation] != 0 {
			t.Fatalf("LIST_META_CONTEXT %q: %v, final %#x", q, got, typ)
		}
	}
	if got, typ := c.metaOption(OptListMetaContext, "a", "other:x"); typ != RepAck || len(got) != 0 {
		t.Fatalf("LIST_META_CONTEXT of an unknown namespace: %v, %#x", got, typ)
	}
	if got, typ := c.metaOption(OptListMetaContext, "plain"); typ != RepAck || len(got) != 0 {
		t.Fatalf("LIST_META_CONTEXT of an export without block status: %v, %#x", got, typ)
	}
	if _, typ := c.metaOption(OptSetMetaContext, "nope", MetaBaseAllocation); typ != RepErrUnknown {
		t.Fatalf("SET_META_CONTEXT of an unknown export: %#x", typ)
	}
	c.option(OptSetMetaContext, []byte{0, 0, 0, 9, 'a'})
	if r := c.optReply(); r.typ != RepErrInvalid {
		t.Fatalf("malformed SET_META_CONTEXT: %#x", r.typ)
	}
	got, typ := c.metaOption(OptSetMetaContext, "a", MetaBaseAllocation)
	if typ != RepAck || len(got) != 1 || got[MetaBaseAllocation] != metaAllocID {
		t.Fatalf("SET_META_CONTEXT: %v, final %#x", got, typ)
	}
	c.goExport("a")
	c.send(CmdBlockStatus, 0, 5, 0, 8192, nil)
	if id, d := descriptors(t, c.chunk()); id != metaAllocID || len(d) != 1 || d[0] != [2]uint32{8192, StateHole | StateZero} {
		t.Fatalf("BLOCK_STATUS of a new export: context %d, %v", id, d)
	}
}

// plainBackend is a Backend and nothing more (memBackend's BlockStatus
// hidden).
type plainBackend struct{ Backend }

// TestStructuredReplies: with structured replies negotiated, reads are
// answered with one data chunk or one error chunk, BLOCK_STATUS with the
// descriptors of base:allocation (one with REQ_ONE) or an error chunk
// when base:allocation was not selected for the export, other commands
// with simple replies.
func TestStructuredReplies(t *testing.T) {
	srv, a, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.option(OptStructuredReply, nil)
	if r := c.optReply(); r.typ != RepAck {
		t.Fatalf("STRUCTURED_REPLY: %#x", r.typ)
	}
	// base:allocation selected for b, then a is chosen: no block status.
	if got, _ := c.metaOption(OptSetMetaContext, "b", MetaBaseAllocation); len(got) != 1 {
		t.Fatalf("SET_META_CONTEXT b: %v", got)
	}
	c.goExport("a")
	data := bytes.Repeat([]byte{0xab}, 8192)
	c.send(CmdWrite, 0, 1, 4096, 8192, data)
	if r := c.reply(); r.errno != 0 || r.cookie != 1 {
		t.Fatalf("write: %+v", r)
	}
	c.send(CmdRead, 0, 2, 4096, 8192, nil)
	delete(c.reads, 2)
	ch := c.chunk()
	if ch.typ != ReplyTypeOffsetData || ch.flags != ReplyFlagDone || ch.cookie != 2 ||
		binary.BigEndian.Uint64(ch.payload) != 4096 || !bytes.Equal(ch.payload[8:], data) {
		t.Fatalf("read chunk: type %d flags %d cookie %d payload %d bytes", ch.typ, ch.flags, ch.cookie, len(ch.payload))
	}
	c.send(CmdRead, 0, 3, 1<<20, 4096, nil)
	delete(c.reads, 3)
	if ch := c.chunk(); ch.typ != ReplyTypeError || ch.flags != ReplyFlagDone || binary.BigEndian.Uint32(ch.payload) != EINVAL ||
		len(ch.payload) != 6 {
		t.Fatalf("read past the end: %+v", ch)
	}
	c.send(CmdRead, 0, 4, 0, 0, nil)
	delete(c.reads, 4)
	if ch := c.chunk(); ch.typ != ReplyTypeNone || ch.flags != ReplyFlagDone || len(ch.payload) != 0 {
		t.Fatalf("empty read: %+v", ch)
	}
	c.send(CmdBlockStatus, 0, 6, 0, 4096, nil)
	if ch := c.chunk(); ch.typ != ReplyTypeError || binary.BigEndian.Uint32(ch.payload) != EINVAL {
		t.Fatalf("BLOCK_STATUS on an export without base:allocation selected: %+v", ch)
	}
	if r := c.do(CmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatalf("flush: %+v", r)
	}
	_ = a

	// A second connection selects base:allocation for a.
	c = dial(t, s.addr, clientFlagFixedNewstyle)
	c.option(OptStructuredReply, nil)
	c.optReply()
	c.metaOption(OptSetMetaContext, "a", MetaBaseAllocation)
	c.goExport("a")
	c.send(CmdBlockStatus, 0, 7, 0, 64<<10, nil)
	id, d := descriptors(t, c.chunk())
	want := [][2]uint32{{4096, StateHole | StateZero}, {8192, 0}, {64<<10 - 12288, StateHole | StateZero}}
	if id != metaAllocID || len(d) != len(want) || d[0] != want[0] || d[1] != want[1] || d[2] != want[2] {
		t.Fatalf("BLOCK_STATUS: context %d, %v, want %v", id, d, want)
	}
	c.send(CmdBlockStatus, CmdFlagReqOne, 8, 4096, 64<<10, nil)
	if _, d := descriptors(t, c.chunk()); len(d) != 1 || d[0] != [2]uint32{8192, 0} {
		t.Fatalf("BLOCK_STATUS with REQ_ONE: %v", d)
	}
	c.send(CmdBlockStatus, 0, 9, 0, 0, nil)
	if ch := c.chunk(); ch.typ != ReplyTypeError || binary.BigEndian.Uint32(ch.payload) != EINVAL {
		t.Fatalf("BLOCK_STATUS of length 0: %+v", ch)
	}
}

// TestBlockStatusDefaultExport: base:allocation selected for the default
// export by the empty name, then the default export chosen by the empty
// name (what nbdinfo --map nbd://host and qemu-img map nbd://host do):
// BLOCK_STATUS is answered.
func TestBlockStatusDefaultExport(t *testing.T) {
	srv, _, _ := twoExports()
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.option(OptStructuredReply, nil)
	if r := c.optReply(); r.typ != RepAck {
		t.Fatalf("STRUCTURED_REPLY: %#x", r.typ)
	}
	got, typ := c.metaOption(OptSetMetaContext, "", MetaBaseAllocation)
	if typ != RepAck || len(got) != 1 || got[MetaBaseAllocation] != metaAllocID {
		t.Fatalf("SET_META_CONTEXT of the default export: %v, final %#x", got, typ)
	}
	c.goExport("")
	c.send(CmdBlockStatus, 0, 5, 0, 8192, nil)
	ch := c.chunk()
	if ch.typ == ReplyTypeError {
		t.Fatalf("BLOCK_STATUS of the default export: error %d", binary.BigEndian.Uint32(ch.payload))
	}
	if id, d := descriptors(t, ch); id != metaAllocID || len(d) != 1 || d[0] != [2]uint32{8192, StateHole | StateZero} {
		t.Fatalf("BLOCK_STATUS of the default export: context %d, %v", id, d)
	}
}

// TestFailedSetMetaContextClearsSelection: an NBD_OPT_SET_META_CONTEXT
// replaces the earlier selection even when it fails (the specification's
// rule), so base:allocation selected before it is not used.
func TestFailedSetMetaContextClearsSelection(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want uint32
	}{
		{"unknown export", AppendMetaContextRequest(nil, MetaContextRequest{Name: "nope", Queries: []string{MetaBaseAllocation}}),
			RepErrUnknown},
		{"malformed", []byte{0, 0, 0, 9, 'a'}, RepErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, _ := twoExports()
			s := serve(t, srv)
			c := dial(t, s.addr, clientFlagFixedNewstyle)
			c.option(OptStructuredReply, nil)
			if r := c.optReply(); r.typ != RepAck {
				t.Fatalf("STRUCTURED_REPLY: %#x", r.typ)
			}
			if got, typ := c.metaOption(OptSetMetaContext, "a", MetaBaseAllocation); typ != RepAck || len(got) != 1 {
				t.Fatalf("SET_META_CONTEXT a: %v, final %#x", got, typ)
			}
			c.option(OptSetMetaContext, tc.data)
			if r := c.optReply(); r.typ != tc.want {
				t.Fatalf("failing SET_META_CONTEXT: %#x, want %#x", r.typ, tc.want)
			}
			c.goExport("a")
			c.send(CmdBlockStatus, 0, 5, 0, 8192, nil)
			if ch := c.chunk(); ch.typ != ReplyTypeError || binary.BigEndian.Uint32(ch.payload) != EINVAL {
				t.Fatalf("BLOCK_STATUS after a failed SET_META_CONTEXT: chunk type %d, want an EINVAL error", ch.typ)
			}
		})
	}
}
