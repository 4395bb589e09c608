package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/initiator/nbd"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// logCount is a slog.Handler that counts records by message. (It keeps
// them from the test's log: the stack's goroutines may still log after
// the test ended.)
type logCount struct {
	mu   *sync.Mutex
	seen map[string]int
}

func newLogCount() logCount { return logCount{mu: &sync.Mutex{}, seen: map[string]int{}} }

func (h logCount) Enabled(context.Context, slog.Level) bool { return true }

func (h logCount) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.seen[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h logCount) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h logCount) WithGroup(string) slog.Handler { return h }

func (h logCount) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[msg]
}

// nbdStack runs what `rinit nbd` runs, in one process: a target on a
// memory store, an initiator logged in to its volume "vol" (16 MiB), and
// the NBD server exporting it. It returns the NBD address.
func nbdStack(t *testing.T, log *slog.Logger) string {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	return nbdStackOn(t, log, st)
}

// nbdStackOn is nbdStack on st (which the caller closes), where it
// creates the volume "vol".
func nbdStackOn(t *testing.T, log *slog.Logger, st store.Store) string {
	t.Helper()
	ctx := context.Background()
	if _, err := st.CreateVolume(ctx, "vol", 16<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tdev, err := rnic.Open(rnic.Config{Name: "target", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tdev.Close() })
	secret := []byte("nbd stack test")
	tg, err := target.New(target.Config{Store: st, Device: tdev, Secret: target.StaticSecret(secret), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tdev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(ctx, l)
	t.Cleanup(func() { tg.Close() })
	// No heartbeat: its timer and probe every 2 s are not the data path
	// (TestNBDSteadyStateAllocs counts the data path's allocations).
	cl, err := initiator.Connect(ctx, initiator.Config{Addr: l.Addr().String(), Volume: "vol", Initiator: "nbd-test",
		Secret: secret, Logger: log, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	nl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- (&nbd.Server{Exports: []nbd.Export{{Name: "vol", Backend: cl, MultiConn: true}}, Logger: log}).Serve(sctx, nl)
	}()
	t.Cleanup(func() {
		stop()
		<-served
	})
	return nl.Addr().String()
}

// send writes one request (header, then payload) of the given length.
func (c *rawNBD) send(typ uint16, cookie, off uint64, length uint32, payload []byte) {
	h := nbd.Request(c.hdr[:])
	h.Encode(protocol.TransmissionRequestHeader{RequestMagic: protocol.TRANSMISSION_MAGIC_REQUEST, Type: typ,
		Handle: cookie, Offset: off, Length: length})
	if _, err := c.nc.Write(append(c.hdr[:], payload...)); err != nil {
		c.t.Fatal(err)
	}
}

// TestNBDZeroLengthWrite: an NBD_CMD_WRITE of length 0 (which the NBD
// specification says a server should not disconnect over) is answered
// with success, and costs the initiator's session nothing: nothing of
// length 0 reaches the target, which would take it for a protocol
// violation.
func TestNBDZeroLengthWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a target and an initiator")
	}
	logs := newLogCount()
	addr := nbdStack(t, slog.New(logs))
	c := dialExport(t, addr, "vol")
	defer c.nc.Close()
	// A hang guard only: before the fix the reply never came.
	c.nc.SetDeadline(time.Now().Add(30 * time.Second))

	c.send(nbd.CmdWrite, 1, 4096, 0, nil)
	c.reply(1, nil)
	data := bytes.Repeat([]byte("zero-length write"), 4096/16)[:4096]
	c.request(nbd.CmdWrite, 2, 4096, data)
	c.reply(2, nil)
	c.request(nbd.CmdRead, 3, 4096, nil)
	c.reply(3, c.got)
	if !bytes.Equal(c.got, data) {
		t.Fatal("the read does not return what was written")
	}
	if n := logs.count("session lost"); n != 0 {
		t.Fatalf("the initiator lost its session %d times", n)
	}
	if n := logs.count("protocol violation: ending session"); n != 0 {
		t.Fatalf("the target saw %d protocol violations", n)
	}
}

// TestNBDRefusedWritePayloadDoesNotHoldOthers: a connection whose reader
// waits for the payload of a refused WRITE does not hold back the
// requests of the other connections: they share the initiator's QPs, and
// the reader must end its plug of them before it waits for the client.
func TestNBDRefusedWritePayloadDoesNotHoldOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a target and an initiator")
	}
	addr := nbdStack(t, slog.New(slog.DiscardHandler))
	b := dialExport(t, addr, "vol")
	defer b.nc.Close()
	a := dialExport(t, addr, "vol")
	defer a.nc.Close()
	// Hang guards only: before the fix the replies never came.
	for _, c := range []*rawNBD{a, b} {
		c.nc.SetDeadline(time.Now().Add(30 * time.Second))
	}

	// B: a READ, then (in the same segment) the header of a WRITE that is
	// refused (offset not aligned), its payload not sent yet.
	var req []byte
	for _, r := range []struct {
		typ    uint16
		cookie uint64
		off    uint64
	}{{nbd.CmdRead, 1, 0}, {nbd.CmdWrite, 2, 100}} {
		h := nbd.Request(b.hdr[:])
		h.Encode(protocol.TransmissionRequestHeader{RequestMagic: protocol.TRANSMISSION_MAGIC_REQUEST, Type: r.typ,
			Handle: r.cookie, Offset: r.off, Length: 4096})
		req = append(req, b.hdr[:]...)
	}
	if _, err := b.nc.Write(req); err != nil {
		t.Fatal(err)
	}
	// A's READ, and B's, are answered meanwhile.
	a.request(nbd.CmdRead, 3, 8192, nil)
	a.reply(3, a.got)
	b.reply(1, b.got)
	// B's payload: the WRITE is refused, and B carries on.
	if _, err := b.nc.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(b.br, b.rep[:]); err != nil {
		t.Fatal(err)
	}
	if r := nbd.SimpleReply(b.rep[:]); r.Cookie() != 2 || r.Error() != nbd.EINVAL {
		t.Fatalf("misaligned WRITE: cookie %d error %d, want cookie 2 EINVAL", r.Cookie(), r.Error())
	}
	b.request(nbd.CmdRead, 4, 0, nil)
	b.reply(4, b.got)
}
