package rnic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// TestMPARequestWithMarkersRejected: the M flag of an MPA Request asks the
// Responder to insert markers towards the Initiator (RFC 5044 §7.1.1). We
// never send markers, so the Responder answers with a Reply with R=1 (and
// M=0), closes the connection, and never hands the Request to Accept.
func TestMPARequestWithMarkersRejected(t *testing.T) {
	for _, rev := range []uint8{1, 2} {
		t.Run(map[uint8]string{1: "rev1", 2: "rev2"}[rev], func(t *testing.T) {
			s := newSide(t, "responder", pairOpts{})
			l, err := s.dev.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			nc, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			req := mpa.Frame{Markers: true, CRC: true, Rev: rev, PrivateData: []byte("markers please")}
			if rev == 2 {
				req.Enhanced = &mpa.IRDORD{IRD: 4, ORD: 4, P2P: true, RTRWrite: true}
			}
			b, err := req.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := nc.Write(b); err != nil {
				t.Fatal(err)
			}
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			rep, err := mpa.ReadFrame(nc, true)
			if err != nil {
				t.Fatalf("no MPA Reply: %v", err)
			}
			if !rep.Reject || rep.Markers || rep.Rev != rev {
				t.Fatalf("Reply %+v, want a rev %d reject without markers", rep, rev)
			}
			if n, err := io.Copy(io.Discard, nc); n != 0 || err != nil {
				t.Fatalf("after the reject: %d more bytes, %v (want a clean close)", n, err)
			}
			// The handshake has answered and closed: a Request it handed on
			// would be waiting for Accept now, and an Accept whose context is
			// done picks it at random against the context (so, many tries).
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for range 64 {
				if cr, err := l.Accept(ctx); err == nil {
					t.Fatalf("the Request reached Accept: %+v", cr)
				}
			}
			if st := s.qp.State(); st != StateIdle {
				t.Fatalf("QP state %s", st)
			}
		})
	}
}

// TestMPAReplyWithMarkersRefused: a Reply with M=1 asks the Initiator to
// insert markers, which we do not: the Initiator does not enter RDMA mode,
// sends a Terminate LLP / MPA / Invalid MPA Request or Reply Frame
// (2/0/0x04, no echoed headers) as its only FPDU, closes, and Connect fails
// with ErrMPA (RFC 5044 §7.1). The QP stays Idle.
func TestMPAReplyWithMarkersRefused(t *testing.T) {
	s := newSide(t, "initiator", pairOpts{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		req  mpa.Frame
		term []byte
		rest int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		nc, err := ln.Accept()
		if err != nil {
			r.err = err
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		if r.req, r.err = mpa.ReadFrame(nc, false); r.err != nil {
			return
		}
		rep := mpa.Frame{Reply: true, Markers: true, CRC: true, Rev: r.req.Rev}
		if r.req.Enhanced != nil {
			rep.Enhanced = &mpa.IRDORD{IRD: 4, ORD: 4, P2P: true, RTRWrite: true}
		}
		b, err := rep.Append(nil)
		if err != nil {
			r.err = err
			return
		}
		if _, r.err = nc.Write(b); r.err != nil {
			return
		}
		rd := mpa.NewReader(nc, mpa.ReaderConfig{CRC: true})
		n, err := rd.Next()
		if err != nil {
			r.err = err
			return
		}
		r.term = make([]byte, n)
		if r.err = rd.ReadFull(r.term); r.err != nil {
			return
		}
		if r.err = rd.Finish(); r.err != nil {
			return
		}
		r.rest, r.err = io.Copy(io.Discard, nc)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = s.dev.Connect(ctx, s.qp, ln.Addr().String(), ConnParams{})
	if !errors.Is(err, ErrMPA) {
		t.Fatalf("Connect: %v, want ErrMPA", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.req.Markers {
		t.Fatal("our MPA Request asked for markers")
	}
	if len(r.term) < ddp.UntaggedHeaderLen {
		t.Fatalf("FPDU of %d bytes", len(r.term))
	}
	h := ddp.Untagged(r.term)
	if h.RsvdULP0() != rdmap.Ctrl(rdmap.OpTerminate) || h.QN() != rdmap.QNTerminate || h.MSN() != 1 || !h.Last() {
		t.Fatalf("not a Terminate: %x", r.term)
	}
	f, err := rdmap.ParseTerminate(r.term[ddp.UntaggedHeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	want := term.Cause{Layer: term.LayerLLP, EType: term.LLPMPA, Code: term.MPAInvalidFrame}
	if f.Cause != want || f.M || f.D || f.R {
		t.Fatalf("Terminate %+v, want %v without echoed headers", f, want)
	}
	if r.rest != 0 {
		t.Fatalf("%d bytes after the Terminate", r.rest)
	}
	if st := s.qp.State(); st != StateIdle {
		t.Fatalf("QP state %s", st)
	}
}

// TestMPAReplyErrorsKeepTheirCause: a Connect that fails reading the MPA
// Reply is ErrMPA and keeps the cause beneath it for errors.Is and
// errors.As: the frame's *term.Error (a Request key where the Reply is
// due), io.EOF (the Responder closed without answering), the deadline (it
// never answered).
func TestMPAReplyErrorsKeepTheirCause(t *testing.T) {
	reqKey := []byte("MPA ID Req Frame\x40\x01\x00\x00")
	for _, c := range []struct {
		name  string
		reply func(nc net.Conn) // after the Request was read
		check func(err error) bool
	}{
		{"wrong-key", func(nc net.Conn) { nc.Write(reqKey) }, func(err error) bool {
			var te *term.Error
			return errors.As(err, &te) && te.Cause.Code == term.MPAInvalidFrame
		}},
		{"closed", func(nc net.Conn) { nc.Close() }, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"silent", func(nc net.Conn) {}, func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSide(t, "initiator", pairOpts{cfg: Config{MPATimeout: 200 * time.Millisecond}})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				if _, err := mpa.ReadFrame(nc, false); err == nil {
					c.reply(nc)
				}
				io.Copy(io.Discard, nc) // until the Initiator gives up
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = s.dev.Connect(ctx, s.qp, ln.Addr().String(), ConnParams{})
			if !errors.Is(err, ErrMPA) || !c.check(err) {
				t.Fatalf("Connect: %v (%#v): want ErrMPA and the cause", err, err)
			}
		})
	}
}

// recordHandler sends every log record to a channel.
type recordHandler struct{ ch chan slog.Record }

func (h recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { h.ch <- r; return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }

// TestProbeIsNotABadRequest: a connection that closes before sending a
// byte (a port probe: make run's wait for the target) is logged at Debug,
// not as a bad MPA Request; one that sends a broken Request still is, at
// Info.
func TestProbeIsNotABadRequest(t *testing.T) {
	records := make(chan slog.Record, 16)
	d, err := Open(Config{Name: "responder", Logger: slog.New(recordHandler{records})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := d.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	next := func() slog.Record {
		t.Helper()
		select {
		case r := <-records:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("nothing logged")
		}
		return slog.Record{}
	}
	for _, c := range []struct {
		send  []byte
		level slog.Level
		msg   string
	}{
		{nil, slog.LevelDebug, "connection closed before an MPA Request"},
		{[]byte("GET / HTTP/1.1\r\n\r\n"), slog.LevelInfo, "bad MPA Request: closing"},
		{[]byte("MPA ID Req"), slog.LevelInfo, "bad MPA Request: closing"}, // cut short
	} {
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(c.send)
		nc.Close()
		r := next()
		for r.Message != c.msg && r.Level < slog.LevelInfo { // other Debug lines
			r = next()
		}
		if r.Message != c.msg || r.Level != c.level {
			t.Fatalf("after sending %q: logged %s %q, want %s %q", c.send, r.Level, r.Message, c.level, c.msg)
		}
	}
}

// TestReplySaysCRCInUse: a Responder that does not ask for CRCs answers an
// Initiator that does with C=1 in its Reply (CRC is used when either side
// asks, RFC 5044 §7.1, and the Reply says so), on both revisions; an
// Initiator that does not ask gets C=0.
func TestReplySaysCRCInUse(t *testing.T) {
	for _, c := range []struct {
		rev int
		crc bool
	}{{1, true}, {2, true}, {1, false}, {2, false}} {
		t.Run(fmt.Sprintf("rev%d-crc%v", c.rev, c.crc), func(t *testing.T) {
			s := newSide(t, "responder", pairOpts{})
			l, err := s.dev.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			accepted := make(chan error, 1)
			go func() {
				cr, err := l.Accept(ctx)
				if err == nil {
					_, err = cr.Accept(ctx, s.qp, AcceptParams{NoCRC: true})
				}
				accepted <- err
			}()
			p, err := rawpeer.Dial(ctx, l.Addr().String(), rawpeer.Options{Rev: c.rev, CRC: c.crc})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Conn.Close()
			if err := <-accepted; err != nil {
				t.Fatal(err)
			}
			if p.Reply.CRC != c.crc || int(p.Reply.Rev) != c.rev {
				t.Fatalf("Reply rev %d C=%v, want rev %d C=%v", p.Reply.Rev, p.Reply.CRC, c.rev, c.crc)
			}
			if si := s.qp.Query().Stream; si == nil || si.CRC != c.crc {
				t.Fatalf("stream %+v", si)
			}
		})
	}
}
