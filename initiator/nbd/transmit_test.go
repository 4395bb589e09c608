package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

func oneExport(be Backend) *Server {
	return &Server{Exports: []Export{{Name: "x", Backend: be, MultiConn: true}}}
}

func TestCommands(t *testing.T) {
	m := newMem(1 << 20)
	s := serve(t, oneExport(m))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")

	p := pattern(64<<10, 1)
	if r := c.do(CmdWrite, 0, 8192, uint32(len(p)), p); r.errno != 0 {
		t.Fatalf("write: %d", r.errno)
	}
	if r := c.do(CmdRead, 0, 8192, uint32(len(p)), nil); r.errno != 0 || !bytes.Equal(r.data, p) {
		t.Fatalf("read back: errno %d, equal %v", r.errno, bytes.Equal(r.data, p))
	}
	if !bytes.Equal(m.snapshot(8192, int64(len(p))), p) {
		t.Fatal("backend does not hold the written data")
	}

	// FUA write and flush reach the backend.
	if r := c.do(CmdWrite, CmdFlagFUA, 0, 512, pattern(512, 2)); r.errno != 0 {
		t.Fatalf("FUA write: %d", r.errno)
	}
	if r := c.do(CmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatalf("flush: %d", r.errno)
	}
	if got := m.fuaWrites.Load(); got != 1 {
		t.Errorf("FUA writes seen by backend: %d, want 1", got)
	}
	if got := m.flushes.Load(); got != 1 {
		t.Errorf("flushes seen by backend: %d, want 1", got)
	}

	// TRIM (with FUA: trim then flush).
	if r := c.do(CmdTrim, CmdFlagFUA, 8192, 4096, nil); r.errno != 0 {
		t.Fatalf("trim: %d", r.errno)
	}
	if m.trims.Load() != 1 || m.flushes.Load() != 2 {
		t.Errorf("trim: backend trims %d flushes %d, want 1 and 2", m.trims.Load(), m.flushes.Load())
	}

	// WRITE_ZEROES with FUA.
	if r := c.do(CmdWriteZeroes, CmdFlagFUA, 16384, 8192, nil); r.errno != 0 {
		t.Fatalf("write zeroes: %d", r.errno)
	}
	if m.zeroes.Load() != 1 || m.fuaZeroes.Load() != 1 {
		t.Errorf("write zeroes: backend %d fua %d", m.zeroes.Load(), m.fuaZeroes.Load())
	}
	// With NO_HOLE too: a Backend that is no AllocatedZeroer gets the
	// zeroes written (WriteAt), then for FUA a flush.
	writes, flushes := m.writes.Load(), m.flushes.Load()
	if r := c.do(CmdWriteZeroes, CmdFlagFUA|CmdFlagNoHole, 24576, 4096, nil); r.errno != 0 {
		t.Fatalf("write zeroes with NO_HOLE: %d", r.errno)
	}
	if m.zeroes.Load() != 1 || m.writes.Load() != writes+1 || m.fuaWrites.Load() != 1 || m.flushes.Load() != flushes+1 {
		t.Errorf("write zeroes with NO_HOLE: backend write-zeroes %d (want 1), writes +%d (want 1), FUA writes %d "+
			"(want 1), flushes +%d (want 1)", m.zeroes.Load(), m.writes.Load()-writes, m.fuaWrites.Load(), m.flushes.Load()-flushes)
	}
	r := c.do(CmdRead, 0, 8192, uint32(len(p)), nil)
	want := append([]byte(nil), p...)
	clear(want[0:4096])      // trimmed (the memory backend zeroes)
	clear(want[8192:16384])  // zeroed
	clear(want[16384:20480]) // zeroed with NO_HOLE
	if r.errno != 0 || !bytes.Equal(r.data, want) {
		t.Fatalf("read after trim/zero: errno %d, data wrong", r.errno)
	}

	// WRITE_ZEROES beyond MaxBlock is allowed (no payload).
	if r := c.do(CmdWriteZeroes, 0, 0, 1<<20, nil); r.errno != 0 {
		t.Fatalf("write zeroes of the whole export: %d", r.errno)
	}
	// CACHE is a no-op; FUA on READ and FLUSH is accepted.
	for _, req := range []struct {
		typ, flags uint16
		off        uint64
		n          uint32
	}{{CmdCache, 0, 0, 4096}, {CmdRead, CmdFlagFUA, 0, 512}, {CmdFlush, CmdFlagFUA, 0, 0}} {
		if r := c.do(req.typ, req.flags, req.off, req.n, nil); r.errno != 0 {
			t.Fatalf("%s flags %#x: errno %d", commandName(req.typ), req.flags, r.errno)
		}
	}
	// Zero-length requests succeed without reaching the backend.
	before := m.writes.Load() + m.reads.Load() + m.trims.Load() + m.zeroes.Load()
	for _, typ := range []uint16{CmdRead, CmdWrite, CmdTrim, CmdWriteZeroes} {
		if r := c.do(typ, 0, 4096, 0, nil); r.errno != 0 || len(r.data) != 0 {
			t.Fatalf("zero-length %s: errno %d, %d bytes", commandName(typ), r.errno, len(r.data))
		}
	}
	if after := m.writes.Load() + m.reads.Load() + m.trims.Load() + m.zeroes.Load(); after != before {
		t.Errorf("zero-length requests made %d backend calls", after-before)
	}
	c.send(CmdDisc, 0, 9, 0, 0, nil)
	s.expectEnd(t, c, nil)
}

// TestRequestErrors: every refused request is answered with its error and
// the connection carries on.
func TestRequestErrors(t *testing.T) {
	m := newMem(1 << 20)
	injected := map[int64]error{
		512 * 3:  errors.New("disk on fire"),
		512 * 5:  &Error{Errno: ENOSPC, Err: errors.New("thin pool full")},
		512 * 7:  fmt.Errorf("quota: %w", syscall.EDQUOT),
		512 * 9:  syscall.EROFS,
		512 * 11: &Error{Errno: 4242},
	}
	m.hook = func(_ context.Context, op string, off, n int64) error {
		if op == "read" || op == "write" {
			return injected[off]
		}
		return nil
	}
	srv := &Server{Exports: []Export{
		{Name: "rw", Backend: m, MaxBlock: 1 << 16},
		{Name: "ro", Backend: m, ReadOnly: true},
	}}
	s := serve(t, srv)

	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("rw")
	for _, tc := range []struct {
		name       string
		typ, flags uint16
		off        uint64
		n          uint32
		payload    bool
		want       uint32
	}{
		{"unaligned offset", CmdRead, 0, 100, 512, false, EINVAL},
		{"unaligned length", CmdWrite, 0, 0, 100, true, EINVAL},
		{"read past end", CmdRead, 0, 1<<20 - 512, 1024, false, EINVAL},
		{"read offset past end", CmdRead, 0, 1 << 40, 512, false, EINVAL},
		{"read offset overflow", CmdRead, 0, 1<<64 - 512, 1024, false, EINVAL},
		{"write past end", CmdWrite, 0, 1<<20 - 512, 1024, true, ENOSPC},
		{"write zeroes past end", CmdWriteZeroes, 0, 1 << 20, 512, false, ENOSPC},
		{"trim past end", CmdTrim, 0, 1 << 20, 512, false, EINVAL},
		{"read longer than max payload", CmdRead, 0, 0, 1<<16 + 512, false, EINVAL},
		{"write longer than max payload", CmdWrite, 0, 0, 1<<16 + 512, true, EINVAL},
		{"flush with offset", CmdFlush, 0, 512, 0, false, EINVAL},
		{"unknown command", 42, 0, 0, 512, false, EINVAL},
		{"block status without contexts", CmdBlockStatus, 0, 0, 512, false, EINVAL},
		{"DF flag not advertised", CmdRead, CmdFlagDF, 0, 512, false, EINVAL},
		{"NO_HOLE on write", CmdWrite, CmdFlagNoHole, 0, 512, true, EINVAL},
		{"FAST_ZERO not advertised", CmdWriteZeroes, CmdFlagFastZero, 0, 512, false, EINVAL},
		{"unknown flag", CmdRead, 1 << 12, 0, 512, false, EINVAL},
		{"backend error", CmdRead, 0, 512 * 3, 512, false, EIO},
		{"backend *Error", CmdWrite, 0, 512 * 5, 512, true, ENOSPC},
		{"backend EDQUOT", CmdWrite, 0, 512 * 7, 512, true, ENOSPC},
		{"backend EROFS", CmdWrite, 0, 512 * 9, 512, true, EPERM},
		{"backend undefined errno", CmdRead, 0, 512 * 11, 512, false, EIO},
	} {
		var payload []byte
		if tc.payload {
			payload = pattern(int(tc.n), 9)
		}
		r := c.do(tc.typ, tc.flags, tc.off, tc.n, payload)
		if r.errno != tc.want {
			t.Errorf("%s: errno %d, want %d", tc.name, r.errno, tc.want)
		}
		if len(r.data) != 0 {
			t.Errorf("%s: error reply carried %d bytes", tc.name, len(r.data))
		}
		// Still in sync and usable.
		if r := c.do(CmdRead, 0, 0, 512, nil); r.errno != 0 || len(r.data) != 512 {
			t.Fatalf("after %s: read errno %d", tc.name, r.errno)
		}
	}

	ro := dial(t, s.addr, clientFlagFixedNewstyle)
	ro.goExport("ro")
	for _, typ := range []uint16{CmdWrite, CmdTrim, CmdWriteZeroes} {
		var payload []byte
		if typ == CmdWrite {
			payload = pattern(512, 1)
		}
		if r := ro.do(typ, 0, 0, 512, payload); r.errno != EPERM {
			t.Errorf("read-only %s: errno %d, want EPERM", commandName(typ), r.errno)
		}
	}
	if r := ro.do(CmdRead, 0, 0, 512, nil); r.errno != 0 {
		t.Fatalf("read-only read: %d", r.errno)
	}
	if m.writes.Load() != 0 {
		t.Errorf("%d writes reached the backend", m.writes.Load())
	}
}

// TestOutOfOrder: the first request blocks in the backend until the
// client has received the reply to the second.
func TestOutOfOrder(t *testing.T) {
	t.Run("blocking", func(t *testing.T) { testOutOfOrder(t, false) })
	t.Run("async", func(t *testing.T) { testOutOfOrder(t, true) })
}

func testOutOfOrder(t *testing.T, async bool) {
	var be Backend
	var m *memBackend
	if async {
		a := newAsyncMem(1 << 20)
		be, m = a, a.memBackend
	} else {
		m = newMem(1 << 20)
		be = m
	}
	copy(m.data, pattern(1<<20, 4))
	release := make(chan struct{})
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		if op == "read" && off == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	s := serve(t, oneExport(be))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	c.send(CmdRead, 0, 1, 0, 4096, nil)
	c.send(CmdRead, 0, 2, 4096, 4096, nil)
	r := c.reply()
	if r.cookie != 2 || r.errno != 0 || !bytes.Equal(r.data, pattern(1<<20, 4)[4096:8192]) {
		t.Fatalf("first reply: cookie %d errno %d, want cookie 2 with data", r.cookie, r.errno)
	}
	close(release)
	r = c.reply()
	if r.cookie != 1 || r.errno != 0 || !bytes.Equal(r.data, pattern(1<<20, 4)[:4096]) {
		t.Fatalf("second reply: cookie %d errno %d, want cookie 1 with data", r.cookie, r.errno)
	}
}

// TestDiscWaitsForInFlight: requests in flight when NBD_CMD_DISC arrives
// are completed and answered before the connection closes.
func TestDiscWaitsForInFlight(t *testing.T) {
	m := newMem(1 << 20)
	entered := make(chan struct{}, 8)
	release := make(chan struct{})
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		if op == "write" {
			entered <- struct{}{}
			<-release
		}
		return nil
	}
	s, c, log := serveWatched(t, m)
	for i := range 3 {
		c.send(CmdWrite, 0, uint64(10+i), uint64(i)*4096, 4096, pattern(4096, byte(i)))
	}
	for range 3 {
		<-entered
	}
	c.send(CmdDisc, 0, 99, 0, 0, nil)
	log.wait(t, "nbd: NBD_CMD_DISC", 1) // the server saw DISC first
	close(release)
	seen := map[uint64]bool{}
	for range 3 {
		r := c.reply()
		if r.errno != 0 {
			t.Fatalf("cookie %d: errno %d", r.cookie, r.errno)
		}
		seen[r.cookie] = true
	}
	if !seen[10] || !seen[11] || !seen[12] {
		t.Fatalf("replies for %v", seen)
	}
	s.expectEnd(t, c, nil)
	for i := range 3 {
		if !bytes.Equal(m.snapshot(int64(i)*4096, 4096), pattern(4096, byte(i))) {
			t.Fatalf("write %d not applied", i)
		}
	}
}

// holdFirstWrite makes m's first write wait, once entered is closed, until
// its context ends or release is closed; cause then receives the cause of
// the write's context (nil if release ended the wait).
func holdFirstWrite(m *memBackend) (entered, release chan struct{}, cause chan error) {
	entered, release, cause = make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var first atomic.Bool
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		if op != "write" || !first.CompareAndSwap(false, true) {
			return nil
		}
		close(entered)
		select {
		case <-ctx.Done():
		case <-release:
		}
		cause <- context.Cause(ctx)
		return nil
	}
	return entered, release, cause
}

// TestClientLeavingAbandonsRequests: a client that closes its connection
// without NBD_CMD_DISC abandons its requests in flight: the context of
// the Backend call still running is cancelled, with ErrClientGone as its
// cause, and the server says so in its log. After NBD_CMD_DISC it is not:
// the requests in flight run to the end (TestDiscWaitsForInFlight).
func TestClientLeavingAbandonsRequests(t *testing.T) {
	for _, disc := range []bool{false, true} {
		t.Run(map[bool]string{false: "close", true: "disc"}[disc], func(t *testing.T) {
			m := newMem(1 << 20)
			entered, release, cause := holdFirstWrite(m)
			s, c, log := serveWatched(t, m)
			c.send(CmdWrite, 0, 7, 0, 4096, pattern(4096, 3))
			<-entered
			if disc {
				c.send(CmdDisc, 0, 8, 0, 0, nil)
				log.wait(t, "nbd: NBD_CMD_DISC", 1)
				// The reader stopped; the write is not abandoned:
				// only its release ends it.
				select {
				case err := <-cause:
					t.Fatalf("the write's context ended after NBD_CMD_DISC: %v", err)
				case <-time.After(100 * time.Millisecond):
				}
				close(release)
				if err := <-cause; err != nil {
					t.Fatalf("the write's context after NBD_CMD_DISC: %v, want none", err)
				}
				if r := c.reply(); r.cookie != 7 || r.errno != 0 {
					t.Fatalf("reply: cookie %d errno %d", r.cookie, r.errno)
				}
				s.expectEnd(t, c, nil)
				return
			}
			c.nc.Close()
			if err := <-cause; !errors.Is(err, ErrClientGone) {
				t.Fatalf("the write's context after the client left: cause %v, want ErrClientGone", err)
			}
			log.wait(t, abandonedMsg, 1)
		})
	}
}

// serveWatched serves be as the one export "x" with a watched log, and
// returns a client in its transmission phase.
func serveWatched(t *testing.T, be Backend) (*served, *rawClient, *logWatch) {
	t.Helper()
	srv := oneExport(be)
	log := watchLog(t)
	srv.Logger = log.Logger
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	return s, c, log
}

func TestBadRequestMagicCloses(t *testing.T) {
	s := serve(t, oneExport(newMem(1<<20)))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	if r := c.do(CmdRead, 0, 0, 512, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}
	hdr := make([]byte, RequestSize)
	Request(hdr).SetMagic(0x12345678)
	c.write(hdr)
	s.expectEnd(t, c, ErrProtocol)
}

// TestBadMagicWithRequestInFlight: a request in flight when the client
// breaks the protocol is still answered before the connection closes.
func TestBadMagicWithRequestInFlight(t *testing.T) {
	m := newMem(1 << 20)
	copy(m.data, pattern(4096, 8))
	entered, release := make(chan struct{}), make(chan struct{})
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		if op == "read" {
			close(entered)
			<-release
		}
		return nil
	}
	s, c, log := serveWatched(t, m)
	c.send(CmdRead, 0, 5, 0, 4096, nil)
	<-entered
	c.write(make([]byte, RequestSize))    // magic 0
	log.wait(t, "nbd: reader stopped", 1) // the server saw the bad magic first
	close(release)
	if r := c.reply(); r.cookie != 5 || r.errno != 0 || !bytes.Equal(r.data, pattern(4096, 8)) {
		t.Fatalf("in-flight read: cookie %d errno %d", r.cookie, r.errno)
	}
	s.expectEnd(t, c, ErrProtocol)
}

func TestOversizeWriteCloses(t *testing.T) {
	s := serve(t, oneExport(newMem(1<<20)))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	c.send(CmdWrite, 0, 1, 0, 32<<20+512, nil) // header only; the server must not wait for 32 MiB
	s.expectEnd(t, c, ErrProtocol)
}

// TestShutdown: cancelling the server's context answers the request in
// flight with ESHUTDOWN, closes the connection and ends Serve.
func TestShutdown(t *testing.T) {
	m := newMem(1 << 20)
	entered := make(chan struct{})
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		if op == "read" {
			close(entered)
			<-ctx.Done()
			return fmt.Errorf("read aborted: %w", ctx.Err())
		}
		return nil
	}
	l := listen(t, "tcp", "127.0.0.1:0")
	cancel, wait := serveOn(t, oneExport(m), l)

	c := dial(t, l.Addr().String(), clientFlagFixedNewstyle)
	c.goExport("x")
	c.send(CmdRead, 0, 7, 0, 512, nil)
	<-entered
	cancel()
	if r := c.reply(); r.cookie != 7 || r.errno != ESHUTDOWN {
		t.Fatalf("reply cookie %d errno %d, want 7 ESHUTDOWN", r.cookie, r.errno)
	}
	c.expectClosed()
	if err := wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestInFlightLimits: the payload budget and the request limit bound what
// the backend sees at once, and everything completes once it unblocks.
func TestInFlightLimits(t *testing.T) {
	const (
		chunk  = 64 << 10
		budget = 256 << 10
		slots  = 6
	)
	m := newMem(8 << 20)
	var cur, peak, curReq, peakReq atomic.Int64 // bytes and requests in the backend
	gate := make(chan struct{})
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		v := cur.Add(n)
		vr := curReq.Add(1)
		for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
		}
		for p := peakReq.Load(); vr > p && !peakReq.CompareAndSwap(p, vr); p = peakReq.Load() {
		}
		<-gate
		cur.Add(-n)
		curReq.Add(-1)
		return nil
	}
	log := watchLog(t)
	srv := &Server{
		Exports:          []Export{{Name: "x", Backend: m, MaxBlock: chunk}},
		MaxInFlight:      slots,
		MaxInFlightBytes: budget,
		Logger:           log.Logger,
	}
	s := serve(t, srv)
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")

	// 32 writes of 64 KiB: only 4 fit in the budget.
	const writes = 32
	var sendErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the socket will push back; send from another goroutine
		defer wg.Done()
		for i := range writes {
			var h [RequestSize]byte
			Request(h[:]).SetMagic(magicRequest)
			Request(h[:]).SetType(CmdWrite)
			Request(h[:]).SetCookie(uint64(i))
			Request(h[:]).SetOffset(uint64(i) * chunk)
			Request(h[:]).SetLength(chunk)
			if _, err := c.nc.Write(append(h[:], pattern(chunk, byte(i))...)); err != nil {
				sendErr = err
				return
			}
		}
	}()
	waitFor(t, func() bool { return peak.Load() >= budget })
	// The reader waits for the budget: it has taken all it will until a
	// reply frees some.
	log.wait(t, "nbd: waiting for payload budget", 1)
	if got := peak.Load(); got > budget {
		t.Errorf("backend held %d payload bytes at once, budget %d", got, budget)
	}
	if got := peak.Load(); got != budget {
		t.Errorf("backend held %d payload bytes at peak, want the whole budget %d", got, budget)
	}
	if got := peakReq.Load(); got != budget/chunk {
		t.Errorf("%d writes in the backend at once, want %d (budget-bound, below MaxInFlight %d)", got, budget/chunk, slots)
	}
	close(gate)
	for range writes {
		if r := c.reply(); r.errno != 0 {
			t.Fatalf("write %d: errno %d", r.cookie, r.errno)
		}
	}
	wg.Wait()
	if sendErr != nil {
		t.Fatal(sendErr)
	}
	for i := range writes {
		if !bytes.Equal(m.snapshot(int64(i)*chunk, chunk), pattern(chunk, byte(i))) {
			t.Fatalf("write %d not applied", i)
		}
	}

	// Small requests are bounded by MaxInFlight.
	gate2 := make(chan struct{})
	var cur2, peak2 atomic.Int64
	m2 := newMem(1 << 20)
	m2.hook = func(ctx context.Context, op string, off, n int64) error {
		v := cur2.Add(1)
		for p := peak2.Load(); v > p && !peak2.CompareAndSwap(p, v); p = peak2.Load() {
		}
		<-gate2
		cur2.Add(-1)
		return nil
	}
	log2 := watchLog(t)
	srv2 := &Server{Exports: []Export{{Name: "y", Backend: m2}}, MaxInFlight: slots, Logger: log2.Logger}
	s2 := serve(t, srv2)
	c2 := dial(t, s2.addr, clientFlagFixedNewstyle)
	c2.goExport("y")
	for i := range 20 {
		c2.send(CmdRead, 0, uint64(i), uint64(i)*512, 512, nil)
	}
	waitFor(t, func() bool { return peak2.Load() >= slots })
	log2.wait(t, "nbd: waiting for a request slot", 1) // all it will take until a reply
	if got := peak2.Load(); got != slots {
		t.Errorf("%d requests in the backend at once, want MaxInFlight %d", got, slots)
	}
	close(gate2)
	for range 20 {
		if r := c2.reply(); r.errno != 0 {
			t.Fatalf("read %d: errno %d", r.cookie, r.errno)
		}
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
	}
}

// TestZeroLengthWriteAsync: a zero-length WRITE succeeds without reaching
// an AsyncBackend either (StartWrite with an empty buffer is not part of
// the Backend contract: the initiator's protocol has no WRITE of length
// 0).
func TestZeroLengthWriteAsync(t *testing.T) {
	a := newAsyncMem(1 << 20)
	s := serve(t, oneExport(a))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	for _, flags := range []uint16{0, CmdFlagFUA} {
		if r := c.do(CmdWrite, flags, 4096, 0, nil); r.errno != 0 {
			t.Fatalf("zero-length write, flags %#x: errno %d", flags, r.errno)
		}
	}
	if n := a.started.Load(); n != 0 {
		t.Errorf("zero-length writes started %d backend writes", n)
	}
	c.send(CmdDisc, 0, 9, 0, 0, nil)
	s.expectEnd(t, c, nil)
}

// TestRefusedWritePayloadUnplugs: the reader ends its plug of the backend
// before it waits for the payload of a refused WRITE, so the requests
// held behind the plug (of this connection and, on a backend shared by
// several, of the others) go out meanwhile.
func TestRefusedWritePayloadUnplugs(t *testing.T) {
	a := newAsyncMem(1 << 20)
	s := serve(t, oneExport(a))
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	// A READ and, in the same segment, the header of a WRITE refused for
	// its misaligned offset, without its payload.
	var h [2 * RequestSize]byte
	Request(h[:]).Encode(protocol.TransmissionRequestHeader{RequestMagic: magicRequest, Type: CmdRead, Handle: 1, Length: 4096})
	Request(h[RequestSize:]).Encode(protocol.TransmissionRequestHeader{RequestMagic: magicRequest, Type: CmdWrite, Handle: 2,
		Offset: 100, Length: 4096})
	c.reads[1] = 4096
	c.write(h[:])
	if r := c.reply(); r.cookie != 1 || r.errno != 0 {
		t.Fatalf("READ: %+v", r)
	}
	c.write(make([]byte, 4096))
	if r := c.reply(); r.cookie != 2 || r.errno != EINVAL {
		t.Fatalf("misaligned WRITE: cookie %d errno %d, want 2 and EINVAL", r.cookie, r.errno)
	}
	c.send(CmdDisc, 0, 9, 0, 0, nil)
	s.expectEnd(t, c, nil)
}

// allocMem is a memBackend that is an AllocatedZeroer.
type allocMem struct {
	*memBackend
	allocated, fuaAllocated atomic.Int64
}

func (a *allocMem) WriteZeroesAllocated(ctx context.Context, off, n int64, fua bool) error {
	a.allocated.Add(1)
	if fua {
		a.fuaAllocated.Add(1)
	}
	a.clear(off, n)
	return nil
}

// TestWriteZeroesNoHole: NBD_CMD_WRITE_ZEROES with NBD_CMD_FLAG_NO_HOLE
// reaches an AllocatedZeroer's WriteZeroesAllocated (FUA passed on),
// without it WriteZeroes; a Backend that is no AllocatedZeroer gets the
// zeroes written with WriteAt in pieces of at most the export's maximum
// payload, without FUA, and one flush for FUA.
func TestWriteZeroesNoHole(t *testing.T) {
	a := &allocMem{memBackend: newMem(4 << 20)}
	plain := newMem(4 << 20)
	s := serve(t, &Server{Exports: []Export{{Name: "alloc", Backend: a}, {Name: "plain", Backend: plain, MaxBlock: 64 << 10}}})
	data := pattern(2<<20, 5)

	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("alloc")
	if r := c.do(CmdWrite, 0, 0, uint32(len(data)), data); r.errno != 0 {
		t.Fatalf("write: %d", r.errno)
	}
	if r := c.do(CmdWriteZeroes, CmdFlagNoHole, 4096, 8192, nil); r.errno != 0 {
		t.Fatalf("NO_HOLE: %d", r.errno)
	}
	if r := c.do(CmdWriteZeroes, CmdFlagNoHole|CmdFlagFUA, 1<<20, 1<<20, nil); r.errno != 0 {
		t.Fatalf("NO_HOLE with FUA: %d", r.errno)
	}
	if r := c.do(CmdWriteZeroes, 0, 65536, 4096, nil); r.errno != 0 {
		t.Fatalf("without NO_HOLE: %d", r.errno)
	}
	if a.allocated.Load() != 2 || a.fuaAllocated.Load() != 1 || a.zeroes.Load() != 1 || a.writes.Load() != 1 {
		t.Errorf("AllocatedZeroer: WriteZeroesAllocated %d (FUA %d), WriteZeroes %d, writes %d; want 2 (1), 1, 1",
			a.allocated.Load(), a.fuaAllocated.Load(), a.zeroes.Load(), a.writes.Load())
	}
	want := bytes.Clone(data)
	clear(want[4096 : 4096+8192])
	clear(want[1<<20 : 2<<20])
	clear(want[65536 : 65536+4096])
	if !bytes.Equal(a.snapshot(0, 2<<20), want) {
		t.Error("the AllocatedZeroer backend does not hold the zeroes")
	}

	c = dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("plain")
	if r := c.do(CmdWrite, 0, 0, 64<<10, data[:64<<10]); r.errno != 0 {
		t.Fatalf("write: %d", r.errno)
	}
	if r := c.do(CmdWriteZeroes, CmdFlagNoHole|CmdFlagFUA, 4096, 1<<20, nil); r.errno != 0 {
		t.Fatalf("NO_HOLE on a plain backend: %d", r.errno)
	}
	if plain.writes.Load() != 1+16 || plain.fuaWrites.Load() != 0 || plain.flushes.Load() != 1 || plain.zeroes.Load() != 0 {
		t.Errorf("plain backend: writes %d (want 1 + 16 pieces of 64 KiB), FUA writes %d, flushes %d, write-zeroes %d",
			plain.writes.Load(), plain.fuaWrites.Load(), plain.flushes.Load(), plain.zeroes.Load())
	}
	want = bytes.Clone(data[:2<<20])
	clear(want[64<<10:])
	clear(want[4096 : 4096+1<<20])
	if !bytes.Equal(plain.snapshot(0, 2<<20), want) {
		t.Error("the plain backend does not hold the zeroes")
	}
}
