package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/initiator/nbd"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

var giveUpSecret = []byte("rinit give-up test secret")

// testTarget is a target on loopback serving a store, as rtarget does.
type testTarget struct {
	dev    *rnic.Device
	tg     *target.Target
	l      *rnic.Listener
	served chan error
	addr   string
}

// startTarget serves st at addr ("127.0.0.1:0": any port), retrying while
// a port just given up by an earlier target is not free yet.
func startTarget(t *testing.T, st store.Store, addr string) *testTarget {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	dev, err := rnic.Open(rnic.Config{Name: "target", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Store: st, Device: dev, Secret: target.StaticSecret(giveUpSecret), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var l *rnic.Listener
	for i := 0; ; i++ {
		if l, err = dev.Listen(addr); err == nil || i == 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTarget{dev: dev, tg: tg, l: l, served: make(chan error, 1), addr: l.Addr().String()}
	go func() { tt.served <- tg.Serve(context.Background(), l) }()
	t.Cleanup(tt.stop)
	return tt
}

// stop shuts the target down as rtarget does on SIGTERM (its sessions get
// GOODBYE), once.
func (tt *testTarget) stop() {
	if tt.tg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tt.tg.Shutdown(ctx)
	<-tt.served
	tt.l.Close()
	tt.dev.Close()
	tt.tg = nil
}

// memVolume returns a memory store holding the volume "vol" (16 MiB).
func memVolume(t *testing.T) store.Store {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	if _, err := st.CreateVolume(context.Background(), "vol", 16<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return st
}

// syncBuffer is an io.Writer the test reads while rinit writes its log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRinitNBD runs `rinit nbd` in this process against targets (a
// --target list), exporting the volume "vol" on a unix socket, whose path
// it returns once the socket accepts connections. rinit's log goes to log;
// its outcome (Run's error) arrives on done. Cancelling ctx is rinit's
// SIGTERM.
func startRinitNBD(t *testing.T, ctx context.Context, targets string, log io.Writer) (sock string, done <-chan error) {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, giveUpSecret, 0o600); err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "nbd.sock")
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, log
	app.ExitErrHandler = func(*cli.Context, error) {}
	ch := make(chan error, 1)
	go func() {
		ch <- app.RunContext(ctx, []string{"rinit", "nbd", "--target", targets, "--volume", "vol", "--secret-file", secret,
			"--listen", "unix:" + sock, "--heartbeat", "0", "--timeout", "5s", "--qps", "1"})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock, ch
		}
		select {
		case err := <-ch:
			t.Fatalf("rinit nbd ended before serving: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rinit nbd does not serve after 20 s\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nbdUnix is a minimal NBD client on a unix socket (NBD_OPT_EXPORT_NAME,
// simple replies) whose requests report failures instead of failing the
// test: a connection the server ends is an outcome here.
type nbdUnix struct {
	nc     net.Conn
	br     *bufio.Reader
	cookie uint64
}

func dialUnix(t *testing.T, sock string) *nbdUnix {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &nbdUnix{nc: nc, br: bufio.NewReader(nc)}
	nc.SetDeadline(time.Now().Add(time.Minute)) // a hang guard
	var g [nbd.GreetingSize]byte
	if _, err := io.ReadFull(c.br, g[:]); err != nil {
		t.Fatal(err)
	}
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 1<<0|1<<1) // fixed newstyle, no zeroes
	b = binary.BigEndian.AppendUint64(b, protocol.NEGOTIATION_MAGIC_OPTION)
	b = binary.BigEndian.AppendUint32(b, nbd.OptExportName)
	b = binary.BigEndian.AppendUint32(b, 3)
	b = append(b, "vol"...)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	var info [10]byte
	if _, err := io.ReadFull(c.br, info[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

// send sends one request (with the next cookie) without waiting for its
// reply.
func (c *nbdUnix) send(typ uint16, off uint64, length uint32, payload []byte) error {
	c.cookie++
	var h [nbd.RequestSize]byte
	nbd.Request(h[:]).Encode(protocol.TransmissionRequestHeader{RequestMagic: protocol.TRANSMISSION_MAGIC_REQUEST, Type: typ,
		Handle: c.cookie, Offset: off, Length: length})
	_, err := c.nc.Write(append(h[:], payload...))
	return err
}

// do sends one request and waits for its reply: the NBD error, and for a
// READ its data; err is set when the connection failed or ended instead.
func (c *nbdUnix) do(typ uint16, off uint64, length uint32, payload []byte) (errno uint32, data []byte, err error) {
	if err := c.send(typ, off, length, payload); err != nil {
		return 0, nil, err
	}
	var rep [nbd.SimpleReplySize]byte
	if _, err := io.ReadFull(c.br, rep[:]); err != nil {
		return 0, nil, err
	}
	sr := nbd.SimpleReply(rep[:])
	if sr.Cookie() != c.cookie {
		return 0, nil, fmt.Errorf("reply for cookie %d, want %d", sr.Cookie(), c.cookie)
	}
	if sr.Error() == 0 && typ == nbd.CmdRead {
		data = make([]byte, length)
		if _, err := io.ReadFull(c.br, data); err != nil {
			return 0, nil, err
		}
	}
	return sr.Error(), data, nil
}

// TestNBDEndsWhenTargetLostForGood: when the initiator gives up
// reconnecting (every target of --target refuses the login for good:
// here the volume is gone from the target that came back), `rinit nbd`
// says so in an error log naming the target and the cause, ends its NBD
// connections (a client sees the export gone, not EIO for ever), and
// exits with an error. Once with one target, once with a list of two.
func TestNBDEndsWhenTargetLostForGood(t *testing.T) {
	if testing.Short() {
		t.Skip("starts targets and rinit")
	}
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d targets", n), func(t *testing.T) {
			var tts []*testTarget
			var addrs []string
			for range n {
				tt := startTarget(t, memVolume(t), "127.0.0.1:0")
				tts, addrs = append(tts, tt), append(addrs, tt.addr)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			log := &syncBuffer{}
			sock, done := startRinitNBD(t, ctx, strings.Join(addrs, ","), log)
			ended := false
			defer func() {
				cancel()
				if ended {
					return
				}
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					t.Error("rinit nbd did not stop on SIGTERM")
				}
			}()
			c := dialUnix(t, sock)
			data := bytes.Repeat([]byte("lost for good "), 4096/14+1)[:4096]
			if errno, _, err := c.do(nbd.CmdWrite, 4096, 4096, data); errno != 0 || err != nil {
				t.Fatalf("WRITE: errno %d, %v", errno, err)
			}
			if errno, _, err := c.do(nbd.CmdFlush, 0, 0, nil); errno != 0 || err != nil {
				t.Fatalf("FLUSH: errno %d, %v", errno, err)
			}
			// Every target goes away and comes back without the volume:
			// each refuses the login for good (StatusNoVolume).
			for i, tt := range tts {
				tt.stop()
				tts[i] = startTarget(t, store.NewMemory(), tt.addr)
			}
			// Until rinit ends the connection, each request fails.
			deadline := time.Now().Add(20 * time.Second)
			var eios int
			for {
				errno, _, err := c.do(nbd.CmdRead, 4096, 4096, nil)
				if err != nil {
					break // the connection ended: the export is gone
				}
				if errno == 0 {
					t.Fatal("a READ succeeded with every target refusing the volume")
				}
				eios++
				if time.Now().After(deadline) {
					t.Fatalf("20 s after the initiator gave up, rinit nbd still answers every request with an error "+
						"(errno %d, %d answers) instead of ending the connection", errno, eios)
				}
				time.Sleep(50 * time.Millisecond)
			}
			var err error
			select {
			case err = <-done:
				ended = true
			case <-time.After(20 * time.Second):
				t.Fatal("rinit nbd still runs 20 s after it ended its NBD connections")
			}
			if err == nil {
				t.Fatal("rinit nbd exited with status 0 after the initiator gave up on the target")
			}
			for _, want := range append([]string{"lost for good", "no such volume"}, addrs...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("rinit nbd's error %q does not say %q", err, want)
				}
			}
			logged := log.String()
			var line string
			for _, l := range strings.Split(logged, "\n") {
				if strings.Contains(l, "level=ERROR") && strings.Contains(l, "gave up") {
					line = l
				}
			}
			if line == "" || !strings.Contains(line, addrs[0]) || !strings.Contains(line, "no such volume") {
				t.Errorf("no error log naming the target and the cause; the log:\n%s", logged)
			}
			t.Logf("rinit nbd exited with: %v\nits error log: %s", err, line)
		})
	}
}

// rinitRun is `rinit nbd` in front of a target on a memory store.
type rinitRun struct {
	st   store.Store
	tt   *testTarget
	log  *syncBuffer
	sock string
	done <-chan error
	stop func() // SIGTERM
}

// rinitOnMemTarget starts a target on a memory store and `rinit nbd` in
// front of it.
func rinitOnMemTarget(t *testing.T) *rinitRun {
	t.Helper()
	r := &rinitRun{st: memVolume(t), log: &syncBuffer{}}
	r.tt = startTarget(t, r.st, "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.stop = cancel
	r.sock, r.done = startRinitNBD(t, ctx, r.tt.addr, r.log)
	return r
}

// exitsCleanly sends rinit SIGTERM and fails the test unless it exits
// with status 0 within 30 s.
func (r *rinitRun) exitsCleanly(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("rinit nbd after SIGTERM: %v, want exit status 0\n%s", err, r.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("rinit nbd did not stop on SIGTERM")
	}
}

// TestNBDSurvivesTargetRestart: a target that restarts with the volume
// (the initiator's reconnect succeeds) costs `rinit nbd` nothing: the same
// NBD connection reads what it wrote, and rinit exits 0 on SIGTERM.
func TestNBDSurvivesTargetRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts targets and rinit")
	}
	r := rinitOnMemTarget(t)
	st, tt, log, sock := r.st, r.tt, r.log, r.sock
	c := dialUnix(t, sock)
	data := bytes.Repeat([]byte("restart "), 512)
	if errno, _, err := c.do(nbd.CmdWrite, 8192, 4096, data); errno != 0 || err != nil {
		t.Fatalf("WRITE: errno %d, %v", errno, err)
	}
	tt.stop()
	tt = startTarget(t, st, tt.addr)
	// The session is re-established; the write, acknowledged but not
	// flushed, was synced by the target's clean shutdown.
	errno, got, err := c.do(nbd.CmdRead, 8192, 4096, nil)
	if errno != 0 || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("READ after the target restarted: errno %d, %v, data equal %v\n%s", errno, err, bytes.Equal(got, data), log)
	}
	if errno, _, err := c.do(nbd.CmdFlush, 0, 0, nil); errno != 0 || err != nil {
		t.Fatalf("FLUSH after the target restarted: errno %d, %v", errno, err)
	}
	select {
	case err := <-r.done:
		t.Fatalf("rinit nbd ended after a target restart: %v\n%s", err, log)
	case <-time.After(200 * time.Millisecond):
	}
	r.exitsCleanly(t)
	if strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("errors logged over a target restart:\n%s", log)
	}
}

// TestNBDDepartedClientWriteNotReplayed: a WRITE that waits for the
// target to come back is abandoned when its client leaves without
// NBD_CMD_DISC (here it closes the connection, as the kernel's NBD client
// does when its timeout fires): when the target is back, it is not
// replayed, so it cannot put older data back over what was written after
// (the client was told nothing). rinit logs that it abandoned it.
func TestNBDDepartedClientWriteNotReplayed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts targets and rinit")
	}
	r := rinitOnMemTarget(t)
	st, tt, log, sock := r.st, r.tt, r.log, r.sock
	first := bytes.Repeat([]byte("first   "), 512)
	c1 := dialUnix(t, sock)
	if errno, _, err := c1.do(nbd.CmdWrite, 8192, 4096, first); errno != 0 || err != nil {
		t.Fatalf("WRITE: errno %d, %v", errno, err)
	}
	tt.stop()

	// A WRITE while no target is there, left waiting: rinit has read it
	// (and dispatched it: its reader looks at the socket again only after)
	// once the socket holds none of its bytes.
	stale := bytes.Repeat([]byte("stale   "), 512)
	if err := c1.send(nbd.CmdWrite, 8192, 4096, stale); err != nil {
		t.Fatal(err)
	}
	waitConsumed(t, c1.nc)
	c1.nc.Close()
	// Its transmission ends at once (no request is left to wait for).
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(log.String(), "requests in flight are abandoned") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the abandoned request after 20 s:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}

	tt = startTarget(t, st, tt.addr)
	c2 := dialUnix(t, sock)
	// FLUSH waits for the writes in flight: a replay of the stale write
	// would be done by the time it returns.
	if errno, _, err := c2.do(nbd.CmdFlush, 0, 0, nil); errno != 0 || err != nil {
		t.Fatalf("FLUSH after the target came back: errno %d, %v\n%s", errno, err, log)
	}
	errno, got, err := c2.do(nbd.CmdRead, 8192, 4096, nil)
	if errno != 0 || err != nil {
		t.Fatalf("READ after the target came back: errno %d, %v\n%s", errno, err, log)
	}
	if !bytes.Equal(got, first) {
		t.Fatalf("READ after the target came back: %.16q..., want the data written before the departed client's WRITE (%.16q...)\n%s",
			got, first, log)
	}
	r.exitsCleanly(t)
}

// waitConsumed waits until the peer has read every byte written to the
// unix stream socket nc (SIOCOUTQ: the bytes it has not read yet).
func waitConsumed(t *testing.T, nc net.Conn) {
	t.Helper()
	raw, err := nc.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var queued int
		var ierr error
		raw.Control(func(fd uintptr) { queued, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if ierr != nil {
			t.Fatalf("SIOCOUTQ: %v", ierr)
		}
		if queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer has not read %d bytes after 20 s", queued)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
