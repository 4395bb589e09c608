package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// pipeConn is a net.Conn that reads a fixed client byte stream and
// discards what the server writes.
type pipeConn struct {
	r *bytes.Reader
}

func (c *pipeConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *pipeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *pipeConn) Close() error                     { return nil }
func (c *pipeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *pipeConn) SetDeadline(time.Time) error      { return nil }
func (c *pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *pipeConn) SetWriteDeadline(time.Time) error { return nil }

// clientStream builds a client byte stream: client flags, options, requests.
type clientStream struct{ b []byte }

func (s *clientStream) flags(f uint32) *clientStream {
	s.b = binary.BigEndian.AppendUint32(s.b, f)
	return s
}

func (s *clientStream) option(id uint32, data []byte) *clientStream {
	var h [OptionSize]byte
	Option(h[:]).Encode(protocol.NegotiationOptionHeader{OptionMagic: magicOption, ID: id, Length: uint32(len(data))})
	s.b = append(append(s.b, h[:]...), data...)
	return s
}

func (s *clientStream) request(typ, flags uint16, off uint64, n uint32, payload []byte) *clientStream {
	var h [RequestSize]byte
	Request(h[:]).Encode(protocol.TransmissionRequestHeader{RequestMagic: magicRequest, CommandFlags: flags, Type: typ, Handle: 1, Offset: off, Length: n})
	s.b = append(append(s.b, h[:]...), payload...)
	return s
}

func goData(name string) []byte {
	return AppendInfoRequest(nil, InfoRequest{Name: name, Infos: []uint16{InfoTypeBlockSize}})
}

// FuzzServeConn feeds arbitrary client bytes to a whole server session:
// it must end, without panicking, with nil or an error. One server and its
// backends serve every input of a fuzzing worker; the backends are zeroed
// after each input, so no input sees what another wrote.
func FuzzServeConn(f *testing.F) {
	f.Add(new(clientStream).flags(1).option(OptList, nil).option(OptAbort, nil).b)
	f.Add(new(clientStream).flags(3).option(OptInfo, goData("a")).option(OptGo, goData("")).
		request(CmdWrite, CmdFlagFUA, 0, 512, bytes.Repeat([]byte{0xab}, 512)).
		request(CmdRead, 0, 0, 4096, nil).request(CmdFlush, 0, 0, 0, nil).
		request(CmdTrim, 0, 512, 512, nil).request(CmdWriteZeroes, CmdFlagNoHole, 0, 1024, nil).
		request(CmdDisc, 0, 0, 0, nil).b)
	f.Add(new(clientStream).flags(1).option(OptExportName, []byte("a")).request(CmdRead, 0, 1<<20, 512, nil).b)
	f.Add(new(clientStream).flags(1).option(OptStructuredReply, nil).option(OptGo, []byte{0, 0, 0, 9}).b)
	f.Add(new(clientStream).flags(1).option(OptGo, goData("a")).request(CmdWrite, 0, 0, 1<<16, nil).b)
	f.Add(new(clientStream).flags(3).option(OptStructuredReply, nil).
		option(OptListMetaContext, AppendMetaContextRequest(nil, MetaContextRequest{Name: "a"})).
		option(OptSetMetaContext, AppendMetaContextRequest(nil, MetaContextRequest{Name: "a", Queries: []string{MetaBaseAllocation}})).
		option(OptGo, goData("a")).request(CmdWrite, 0, 4096, 4096, bytes.Repeat([]byte{1}, 4096)).
		request(CmdBlockStatus, 0, 0, 256<<10, nil).request(CmdBlockStatus, CmdFlagReqOne, 4096, 8192, nil).
		request(CmdRead, 0, 0, 8192, nil).request(CmdRead, 0, 1<<30, 512, nil).request(CmdDisc, 0, 0, 0, nil).b)
	a, ro := newMem(256<<10), newMem(64<<10)
	srv := &Server{
		Exports: []Export{
			{Name: "a", Backend: a, MaxBlock: 64 << 10},
			{Name: "ro", Backend: ro, ReadOnly: true},
		},
		Logger: slog.New(slog.DiscardHandler),
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := srv.ServeConn(context.Background(), &pipeConn{r: bytes.NewReader(data)})
		if err != nil && !errors.Is(err, ErrProtocol) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		clear(a.data)
		clear(ro.data)
	})
}

// FuzzMetaContextRequest: the decoder of NBD_OPT_*_META_CONTEXT data never
// panics, fails only with ErrMalformed, and what it accepts re-encodes to
// the same bytes.
func FuzzMetaContextRequest(f *testing.F) {
	f.Add(AppendMetaContextRequest(nil, MetaContextRequest{Name: "a", Queries: []string{MetaBaseAllocation}}))
	f.Add(AppendMetaContextRequest(nil, MetaContextRequest{}))
	f.Add(AppendMetaContextRequest(nil, MetaContextRequest{Name: "vol", Queries: []string{"base:", "x-y:z", ""}}))
	f.Add([]byte{0, 0, 0, 9, 'a'})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseMetaContextRequest(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if out := AppendMetaContextRequest(nil, r); !bytes.Equal(out, data) {
			t.Fatalf("re-encodes differently:\n in % x\nout % x", data, out)
		}
	})
}
