package rping

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
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
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv, cli := openDev(t, "server"), openDev(t, "client")
			ln, err := srv.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, cli := openDev(t, "server"), openDev(t, "client")
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
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
