package rping

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic"
)

func TestPattern(t *testing.T) {
	// rping.c with -S 80, ping 1: the run starts one character after 'A'.
	b := make([]byte, 80)
	Pattern(b, 1)
	want := "rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzABCDEFGHI\x00"
	if string(b) != want {
		t.Fatalf("pattern\n got %q\nwant %q", b, want)
	}
	Pattern(b[:20], 58)
	if !strings.HasPrefix(string(b), "rdma-ping-58: A") || b[19] != 0 {
		t.Fatalf("ping 58 must restart at 'A': %q", b[:20])
	}
	// Shorter than the prefix: snprintf truncates, the last byte is NUL.
	s := make([]byte, 8)
	Pattern(s, 123)
	if string(s) != "rdma-pi\x00" {
		t.Fatalf("short pattern %q", s)
	}
}

func openDev(t *testing.T, name string) *rnic.Device {
	t.Helper()
	cfg := rnic.DefaultConfig()
	cfg.Name = name
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := rnic.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// serverClient opens a server and a client device, the server listening on
// loopback, and a context that ends after timeout or with the test.
func serverClient(t *testing.T, timeout time.Duration) (context.Context, *rnic.Device, *rnic.Device, *rnic.Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	srv, cli := openDev(t, "server"), openDev(t, "client")
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ctx, srv, cli, ln
}

// TestClientServer runs our client against our server: both MPA revisions,
// with and without CRC, sizes from the minimum to rping's maximum.
func TestClientServer(t *testing.T) {
	for _, c := range []struct {
		rev   int
		crc   bool
		size  int
		count int
	}{{2, false, 4096, 100}, {1, true, 4096, 20}, {2, true, MinSize, 10}, {2, false, MaxSize, 5}} {
		t.Run(fmt.Sprintf("rev%d-crc%v-%d", c.rev, c.crc, c.size), func(t *testing.T) {
			ctx, srv, cli, ln := serverClient(t, 30*time.Second)
			var sout, cout bytes.Buffer
			type res struct {
				st  Stats
				err error
			}
			done := make(chan res, 1)
			go func() {
				st, err := Server(ctx, srv, ln, Options{Size: MaxSize, Count: c.count, Verbose: &sout}, true)
				done <- res{st, err}
			}()
			st, err := Client(ctx, cli, ln.Addr().String(), Options{Size: c.size, Count: c.count, Rev: c.rev, CRC: c.crc, Verbose: &cout, Settle: -1})
			r := <-done
			if err != nil {
				t.Fatalf("client: %v (server: %v)", err, r.err)
			}
			if r.err != nil {
				t.Fatalf("server: %v", r.err)
			}
			if st.Pings != c.count || r.st.Pings != c.count {
				t.Fatalf("pings client %d server %d, want %d", st.Pings, r.st.Pings, c.count)
			}
			if st.Conn.Rev != c.rev || st.Conn.CRC != c.crc {
				t.Fatalf("negotiated rev %d crc %v", st.Conn.Rev, st.Conn.CRC)
			}
			lines := strings.Split(strings.TrimSpace(cout.String()), "\n")
			if len(lines) != c.count || strings.Count(sout.String(), "server ping data: ") != c.count {
				t.Fatalf("client printed %d lines, server %d", len(lines), strings.Count(sout.String(), "\n"))
			}
			want := make([]byte, c.size)
			Pattern(want, c.count-1)
			if lines[c.count-1] != "ping data: "+string(want[:c.size-1]) {
				t.Fatalf("last line %q", lines[c.count-1])
			}
		})
	}
}

// TestServerRejectsWrongData: a client whose data is not rping's pattern
// fails the server, and a client whose echo is corrupted fails the client.
func TestServerRejectsWrongData(t *testing.T) {
	ctx, srv, cli, ln := serverClient(t, 20*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := Server(ctx, srv, ln, Options{Size: 4096}, true)
		errc <- err
	}()
	// A hand-made client that advertises a buffer of zeros.
	o := Options{Size: 64}
	o.defaults()
	e, err := newEndpoint(cli, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	e.postRecv()
	if _, err := cli.Connect(ctx, e.qp, ln.Addr().String(), rnic.ConnParams{NoCRC: true, IRD: 1, ORD: 1}); err != nil {
		t.Fatal(err)
	}
	Advert{Addr: vaSource, STag: e.dataMR.STag(), Size: 64}.encode(e.sendBuf)
	if err := e.send(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "not ping 0's pattern") {
		t.Fatalf("server accepted zeros: %v", err)
	}
}

// TestDisconnectEndsInError: a close that the peer answers with a reset
// ends the wait as soon as the QP is in Error (it used to wait for Idle
// alone, until its 5 s bound, and only then accept Error). The context
// here is that 5 s bound: waiting for Idle alone fails.
func TestDisconnectEndsInError(t *testing.T) {
	ctx, srv, cli, ln := serverClient(t, 20*time.Second)
	o := Options{Size: 64}
	o.defaults()
	var eps [2]*endpoint
	for i, d := range []*rnic.Device{srv, cli} {
		var err error
		if eps[i], err = newEndpoint(d, &o); err != nil {
			t.Fatal(err)
		}
		defer eps[i].close()
	}
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			_, err = req.Accept(ctx, eps[0].qp, rnic.AcceptParams{})
		}
		accepted <- err
	}()
	relay := resetOnFIN(t, ln.Addr().String())
	if _, err := cli.Connect(ctx, eps[1].qp, relay, rnic.ConnParams{IRD: 1, ORD: 1}); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if err := disconnect(dctx, eps[1].qp); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	if st := eps[1].qp.State(); st != rnic.StateError {
		t.Fatalf("QP in %s after disconnect, want Error", st)
	}
}

// resetOnFIN relays one connection to target and answers the client's FIN
// with a reset (TCP RST) of both connections. It returns its address.
func resetOnFIN(t *testing.T, target string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c1, err := ln.Accept()
		if err != nil {
			return
		}
		c2, err := net.Dial("tcp", target)
		if err != nil {
			c1.Close()
			return
		}
		go io.Copy(c1, c2)
		io.Copy(c2, c1) // returns at the client's FIN
		for _, c := range []net.Conn{c1, c2} {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// FuzzDecodeAdvert feeds decodeAdvert what a peer may Send: it never
// panics, refuses anything shorter than an advertisement, and reads the
// fields encode writes.
func FuzzDecodeAdvert(f *testing.F) {
	b := make([]byte, advertLen)
	Advert{Addr: 0x7f00_0000_1000, STag: 0x1234_5601, Size: 100}.encode(b)
	f.Add(b)
	f.Add([]byte{})
	f.Add(make([]byte, advertLen-1))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, msg []byte) {
		a, err := decodeAdvert(msg)
		if len(msg) < advertLen {
			if err == nil {
				t.Fatalf("%d-byte advertisement accepted", len(msg))
			}
			return
		}
		if err != nil {
			t.Fatalf("%d bytes: %v", len(msg), err)
		}
		back := make([]byte, advertLen)
		a.encode(back)
		if !bytes.Equal(back, msg[:advertLen]) {
			t.Fatalf("decoded %+v from %x, encodes to %x", a, msg[:advertLen], back)
		}
	})
}
