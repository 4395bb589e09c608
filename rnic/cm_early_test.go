package rnic

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// earlyListener is a Responder device listening on loopback.
func earlyListener(t *testing.T) (*side, *Listener) {
	t.Helper()
	s := newSide(t, "resp", pairOpts{})
	l, err := s.dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return s, l
}

// refusedWithoutReply reads nc until the Responder closes it and fails if
// anything (an MPA Reply in particular) arrived, or if it stays open.
func refusedWithoutReply(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the Responder kept the connection open")
	}
	if len(got) > 0 {
		t.Fatalf("the Responder sent %d bytes (%q...) to an Initiator that sent data before the Reply", len(got), got[:min(len(got), 20)])
	}
}

// TestEarlyData: an Initiator that sends anything after its MPA Request
// before it has the Reply (RFC 5044 §7.1) is refused by Accept, whether the
// bytes came in the Request's own segment or later, and gets no Reply. A
// well-behaved Initiator's first FPDU, sent right after the Reply, is not
// touched by the check (peeked, never consumed).
func TestEarlyData(t *testing.T) {
	req, err := rawpeer.BuildRequest(rawpeer.Options{CRC: true})
	if err != nil {
		t.Fatal(err)
	}
	var h [18]byte
	fpdu := mpa.AppendFPDU(nil, h[:], []byte("too early"), true)

	accept := func(t *testing.T, s *side, cr *ConnRequest) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cr.Accept(ctx, s.qp, AcceptParams{})
		return err
	}
	wantRefused := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, ErrMPA) || !strings.Contains(err.Error(), "before the MPA Reply") {
			t.Fatalf("Accept: %v, want ErrMPA (data before the MPA Reply)", err)
		}
		t.Logf("Accept: %v", err)
	}
	nextReq := func(t *testing.T, l *Listener) *ConnRequest {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cr, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}

	t.Run("same-segment", func(t *testing.T) {
		s, l := earlyListener(t)
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write(append(append([]byte(nil), req...), fpdu...)); err != nil {
			t.Fatal(err)
		}
		cr := nextReq(t, l)
		if !cr.early {
			t.Error("the bytes that came with the Request were not seen in the handshake's buffer")
		}
		wantRefused(t, accept(t, s, cr))
		refusedWithoutReply(t, nc)
	})

	t.Run("after-request", func(t *testing.T) {
		s, l := earlyListener(t)
		nc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write(req); err != nil {
			t.Fatal(err)
		}
		cr := nextReq(t, l) // the Request is read: anything now comes later
		if cr.early {
			t.Fatal("data seen with a Request sent alone")
		}
		if _, err := nc.Write(fpdu); err != nil {
			t.Fatal(err)
		}
		// Wait until the bytes are in the Responder's receive queue; the
		// peek does not consume them, so it can be asked again and again.
		for deadline := time.Now().Add(10 * time.Second); !cr.earlyData(); {
			if time.Now().After(deadline) {
				t.Fatal("the early FPDU never showed in the receive queue")
			}
			time.Sleep(time.Millisecond)
		}
		wantRefused(t, accept(t, s, cr))
		refusedWithoutReply(t, nc)
	})

	t.Run("rawpeer", func(t *testing.T) {
		s, l := earlyListener(t)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cr, err := l.Accept(ctx)
			if err != nil {
				done <- err
				return
			}
			// Accept once the early FPDU (a second write) is in the
			// receive queue, as a ULP that allocates its QP first might.
			for !cr.earlyData() {
				if ctx.Err() != nil {
					done <- errors.New("the early FPDU never showed in the receive queue")
					return
				}
				time.Sleep(time.Millisecond)
			}
			_, err = cr.Accept(ctx, s.qp, AcceptParams{})
			done <- err
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rawpeer.Dial(ctx, l.Addr().String(), rawpeer.Options{CRC: true, EarlyData: fpdu})
		if !errors.Is(err, rawpeer.ErrNoReply) {
			t.Fatalf("rawpeer with early data: %v, want ErrNoReply", err)
		}
		wantRefused(t, <-done)
	})

	t.Run("clean", func(t *testing.T) {
		s, l := earlyListener(t)
		mr, buf := s.reg(64, LocalWrite)
		s.postRecv(7, mr, 64)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cr, err := l.Accept(ctx)
			if err != nil {
				done <- err
				return
			}
			_, err = cr.Accept(ctx, s.qp, AcceptParams{})
			done <- err
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := rawpeer.Dial(ctx, l.Addr().String(), rawpeer.Options{CRC: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := <-done; err != nil {
			t.Fatalf("Accept of a well-behaved Initiator: %v", err)
		}
		// The RTR went first; this Send must arrive whole.
		msg := []byte("first message after the reply")
		if err := p.Send(p.SendMsg(rdmap.OpSend, 0, msg)); err != nil {
			t.Fatal(err)
		}
		wc := s.waitOK(s.rcq, WRRecv)
		if wc.ID != 7 || !bytes.Equal(buf[:wc.Bytes], msg) {
			t.Fatalf("receive %+v holds %q, want %q", wc, buf[:wc.Bytes], msg)
		}
	})
}
