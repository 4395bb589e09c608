package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"

	"github.com/rnic-dev/rnic/initiator/nbd"
)

// TestNBDSteadyStateAllocs counts the heap allocations of the whole data
// path, in one process: an NBD client's WRITE and READ of 4 KiB through
// the NBD server, the initiator, the RNIC engine on both ends and the
// target (memory store), and the replies back to the client's socket.
// After warm-up an I/O must allocate nothing (the budget below is for
// what the Go runtime itself may do now and then).
func TestNBDSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own (and sync.Pool drops buffers on purpose under it)")
	}
	if testing.Short() {
		t.Skip("starts a target and an initiator")
	}
	addr := nbdStack(t, slog.New(slog.DiscardHandler))
	c := dialExport(t, addr, "vol")
	defer c.nc.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 256)
	io1 := func() {
		c.request(nbd.CmdWrite, 1, 8192, data)
		c.reply(1, nil)
		c.request(nbd.CmdRead, 2, 8192, nil)
		c.reply(2, c.got)
	}
	for range 2000 { // warm up: pools, free lists, queues at their size
		io1()
	}
	if !bytes.Equal(c.got, data) {
		t.Fatal("the read does not return what was written")
	}
	allocs := testing.AllocsPerRun(2000, io1)
	t.Logf("%.3f allocations per NBD WRITE + READ of 4 KiB, socket to target and back", allocs)
	if allocs > 0.05 {
		t.Fatalf("%.3f allocations per WRITE + READ in steady state, want 0 (at most 1 in 20 for the runtime)", allocs)
	}
}

// rawNBD is a minimal NBD client that allocates nothing per request.
type rawNBD struct {
	t   *testing.T
	nc  net.Conn
	br  *bufio.Reader
	hdr [nbd.RequestSize]byte
	rep [nbd.SimpleReplySize]byte
	got []byte
}

// dialExport connects and selects export name with NBD_OPT_EXPORT_NAME.
func dialExport(t *testing.T, addr, name string) *rawNBD {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(time.Minute))
	c := &rawNBD{t: t, nc: nc, br: bufio.NewReader(nc), got: make([]byte, 4096)}
	var g [18]byte
	if _, err := io.ReadFull(c.br, g[:]); err != nil {
		t.Fatal(err)
	}
	var b []byte
	const fixedNewstyle, noZeroes = 1 << 0, 1 << 1 // the client flags
	b = binary.BigEndian.AppendUint32(b, fixedNewstyle|noZeroes)
	b = binary.BigEndian.AppendUint64(b, protocol.NEGOTIATION_MAGIC_OPTION)
	b = binary.BigEndian.AppendUint32(b, nbd.OptExportName)
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	var info [10]byte // size, transmission flags (no zeroes)
	if _, err := io.ReadFull(c.br, info[:]); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *rawNBD) request(typ uint16, cookie, off uint64, payload []byte) {
	h := nbd.Request(c.hdr[:])
	h.SetMagic(protocol.TRANSMISSION_MAGIC_REQUEST)
	h.SetFlags(0)
	h.SetType(typ)
	h.SetCookie(cookie)
	h.SetOffset(off)
	h.SetLength(4096)
	if _, err := c.nc.Write(c.hdr[:]); err != nil {
		c.t.Fatal(err)
	}
	if payload != nil {
		if _, err := c.nc.Write(payload); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *rawNBD) reply(cookie uint64, data []byte) {
	if _, err := io.ReadFull(c.br, c.rep[:]); err != nil {
		c.t.Fatal(err)
	}
	r := nbd.SimpleReply(c.rep[:])
	if r.Cookie() != cookie || r.Error() != 0 {
		c.t.Fatalf("reply cookie %d error %d, want cookie %d", r.Cookie(), r.Error(), cookie)
	}
	if data != nil {
		if _, err := io.ReadFull(c.br, data); err != nil {
			c.t.Fatal(err)
		}
	}
}
