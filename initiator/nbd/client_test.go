package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// testLogger logs to the test output at Debug with -v, else at Warn.
func testLogger(t testing.TB) *slog.Logger {
	lvl := slog.LevelWarn
	if testing.Verbose() {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: lvl}))
}

// logWatch is a logger for a Server under test that lets the test wait
// for a log message: an event the server reports, not a guess of how
// long it takes to get there.
type logWatch struct {
	*slog.Logger
	mu    sync.Mutex
	seen  map[string]int
	wakes []chan struct{}
}

func watchLog(t testing.TB) *logWatch {
	w := &logWatch{seen: map[string]int{}}
	h := testLogger(t).Handler()
	w.Logger = slog.New(watchHandler{w: w, Handler: h})
	return w
}

type watchHandler struct {
	w *logWatch
	slog.Handler
}

func (h watchHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h watchHandler) Handle(ctx context.Context, r slog.Record) error {
	h.w.mu.Lock()
	h.w.seen[r.Message]++
	wakes := h.w.wakes
	h.w.wakes = nil
	h.w.mu.Unlock()
	for _, c := range wakes {
		close(c)
	}
	if h.Handler.Enabled(ctx, r.Level) {
		return h.Handler.Handle(ctx, r)
	}
	return nil
}

func (h watchHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return watchHandler{w: h.w, Handler: h.Handler.WithAttrs(as)}
}

func (h watchHandler) WithGroup(name string) slog.Handler {
	return watchHandler{w: h.w, Handler: h.Handler.WithGroup(name)}
}

// wait waits (10 s at most) until msg has been logged n times in all.
func (w *logWatch) wait(t testing.TB, msg string, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		if w.seen[msg] >= n {
			w.mu.Unlock()
			return
		}
		c := make(chan struct{})
		w.wakes = append(w.wakes, c)
		w.mu.Unlock()
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("the server did not log %q %d times in 10 s", msg, n)
		}
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// served is a Server running on a loopback listener for one test.
type served struct {
	addr string
	// done yields ServeConn's result for each accepted connection, in
	// the order they end.
	done chan error
}

// serve runs srv on a TCP loopback listener, serving each connection
// with ServeConn so that its result can be checked. Everything stops at
// the end of the test.
func serve(t testing.TB, srv *Server) *served {
	t.Helper()
	if srv.Logger == nil {
		srv.Logger = testLogger(t)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{addr: l.Addr().String(), done: make(chan error, 100)}
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() { s.done <- srv.ServeConn(ctx, nc) }()
		}
	}()
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-acceptDone
	})
	return s
}

// result waits for the next connection to end and returns ServeConn's error.
func (s *served) result(t testing.TB) error {
	t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("ServeConn did not return")
		return nil
	}
}

// expectEnd checks that the server closes c's connection and that
// ServeConn returns an error matching want (nil: no error).
func (s *served) expectEnd(t testing.TB, c *rawClient, want error) {
	t.Helper()
	c.expectClosed()
	err := s.result(t)
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("ServeConn: %v, want %v", err, want)
	}
}

// rawClient speaks the NBD protocol by hand, byte by byte, so that tests
// can send anything, including what a real client never would.
type rawClient struct {
	t     testing.TB
	nc    net.Conn
	br    *bufio.Reader
	flags uint16 // transmission flags from the handshake
	size  uint64
	reads map[uint64]uint32 // cookie -> length of pending reads
}

// dial connects over TCP and completes the greeting with the given
// client flags.
func dial(t testing.TB, addr string, clientFlags uint32) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return greet(t, nc, clientFlags)
}

// greet completes the greeting on an established connection.
func greet(t testing.TB, nc net.Conn, clientFlags uint32) *rawClient {
	t.Helper()
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc), reads: map[uint64]uint32{}}
	var g [GreetingSize]byte
	c.readFull(g[:])
	gr := Greeting(g[:])
	if gr.InitMagic() != 0x4e42444d41474943 || gr.OptionMagic() != 0x49484156454F5054 {
		t.Fatalf("greeting magics %#x %#x", gr.InitMagic(), gr.OptionMagic())
	}
	if gr.HandshakeFlags() != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("handshake flags %#x", gr.HandshakeFlags())
	}
	c.write(binary.BigEndian.AppendUint32(nil, clientFlags))
	return c
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rawClient) readFull(b []byte) {
	c.t.Helper()
	if _, err := io.ReadFull(c.br, b); err != nil {
		c.t.Fatalf("read: %v", err)
	}
}

// expectClosed checks that the server closes the connection.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	var b [1]byte
	n, err := c.br.Read(b[:])
	if err == nil {
		c.t.Fatalf("read %d bytes (%#x), want the connection closed", n, b[0])
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		c.t.Fatalf("read: %v, want EOF", err)
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// option sends an option.
func (c *rawClient) option(id uint32, data []byte) {
	c.t.Helper()
	var h [OptionSize]byte
	Option(h[:]).Encode(protocol.NegotiationOptionHeader{OptionMagic: magicOption, ID: id, Length: uint32(len(data))})
	c.write(append(h[:], data...))
}

type optReply struct {
	option, typ uint32
	data        []byte
}

// optReply reads one option reply.
func (c *rawClient) optReply() optReply {
	c.t.Helper()
	var h [OptionReplySize]byte
	c.readFull(h[:])
	r := OptionReply(h[:])
	if r.Magic() != 0x3e889045565a9 {
		c.t.Fatalf("option reply magic %#x", r.Magic())
	}
	if r.Length() > 1<<20 {
		c.t.Fatalf("option reply length %d", r.Length())
	}
	d := make([]byte, r.Length())
	c.readFull(d)
	return optReply{option: r.Option(), typ: r.Type(), data: d}
}

// infoResult is what NBD_OPT_INFO/GO told the client.
type infoResult struct {
	final                 uint32 // RepAck or the error
	errMsg                string
	size                  uint64
	flags                 uint16
	min, pref, max        uint32
	name, desc            string
	haveBlock, haveName   bool
	haveDesc, haveExport  bool
	unexpectedInfoReplies int
}

// info sends NBD_OPT_INFO or NBD_OPT_GO and collects the replies.
func (c *rawClient) info(id uint32, name string, infos ...uint16) infoResult {
	c.t.Helper()
	c.option(id, AppendInfoRequest(nil, InfoRequest{Name: name, Infos: infos}))
	var res infoResult
	for {
		r := c.optReply()
		if r.option != id {
			c.t.Fatalf("reply for option %d, want %d", r.option, id)
		}
		if r.typ != RepInfo {
			res.final = r.typ
			res.errMsg = string(r.data)
			if r.typ == RepAck && id == OptGo {
				c.size, c.flags = res.size, res.flags
			}
			return res
		}
		if len(r.data) < 2 {
			c.t.Fatalf("NBD_REP_INFO of %d bytes", len(r.data))
		}
		switch binary.BigEndian.Uint16(r.data) {
		case InfoTypeExport:
			if len(r.data) != InfoExportSize {
				c.t.Fatalf("NBD_INFO_EXPORT of %d bytes", len(r.data))
			}
			ie := InfoExport(r.data)
			res.size, res.flags, res.haveExport = ie.Size(), ie.Flags(), true
		case InfoTypeBlockSize:
			if len(r.data) != InfoBlockSizeSize {
				c.t.Fatalf("NBD_INFO_BLOCK_SIZE of %d bytes", len(r.data))
			}
			bs := InfoBlockSize(r.data)
			res.min, res.pref, res.max, res.haveBlock = bs.Minimum(), bs.Preferred(), bs.Maximum(), true
		case InfoTypeName:
			res.name, res.haveName = string(r.data[2:]), true
		case InfoTypeDescription:
			res.desc, res.haveDesc = string(r.data[2:]), true
		default:
			res.unexpectedInfoReplies++
		}
	}
}

// goExport enters transmission with NBD_OPT_GO, failing the test otherwise.
func (c *rawClient) goExport(name string) infoResult {
	c.t.Helper()
	res := c.info(OptGo, name, InfoTypeBlockSize)
	if res.final != RepAck {
		c.t.Fatalf("NBD_OPT_GO %q: reply %#x %q", name, res.final, res.errMsg)
	}
	return res
}

// send sends a transmission request; payload follows the header.
func (c *rawClient) send(typ, flags uint16, cookie, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	var h [RequestSize]byte
	Request(h[:]).Encode(protocol.TransmissionRequestHeader{
		RequestMagic: magicRequest, CommandFlags: flags, Type: typ, Handle: cookie, Offset: off, Length: length,
	})
	if typ == CmdRead {
		c.reads[cookie] = length
	}
	c.write(append(h[:], payload...))
}

type simpleReply struct {
	cookie uint64
	errno  uint32
	data   []byte
}

// reply reads the next simple reply; a successful reply to a pending
// read carries its data.
func (c *rawClient) reply() simpleReply {
	c.t.Helper()
	var h [SimpleReplySize]byte
	c.readFull(h[:])
	r := SimpleReply(h[:])
	if r.Magic() != 0x67446698 {
		c.t.Fatalf("reply magic %#x", r.Magic())
	}
	out := simpleReply{cookie: r.Cookie(), errno: r.Error()}
	if n, ok := c.reads[out.cookie]; ok {
		delete(c.reads, out.cookie)
		if out.errno == 0 {
			out.data = make([]byte, n)
			c.readFull(out.data)
		}
	}
	return out
}

// do sends one request and waits for its reply.
func (c *rawClient) do(typ, flags uint16, off uint64, length uint32, payload []byte) simpleReply {
	c.t.Helper()
	const cookie = 0xc0ffee
	c.send(typ, flags, cookie, off, length, payload)
	r := c.reply()
	if r.cookie != cookie {
		c.t.Fatalf("reply cookie %#x, want %#x", r.cookie, cookie)
	}
	return r
}

// pattern returns n bytes derived from seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*7) ^ byte(i>>9)
	}
	return b
}

// listen opens a listener closed at the end of the test.
func listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveOn runs srv.Serve on l. cancel stops it; wait returns Serve's
// result, failing the test if it takes more than 10 s.
func serveOn(t testing.TB, srv *Server, l net.Listener) (cancel func(), wait func() error) {
	t.Helper()
	if srv.Logger == nil {
		srv.Logger = testLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	return cancel, func() error {
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return")
			return nil
		}
	}
}
