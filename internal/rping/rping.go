// Package rping speaks the exchange of rdma-core's rping (librdmacm/examples/
// rping.c, v44.0), so that our RNIC can ping a Linux RNIC and be pinged by
// one. Either role works against the real rping.
//
// One iteration ("ping") of rping, with its 16-byte buffer advertisement
// {be64 address, be32 STag, be32 size} (struct rping_rdma_info):
//
//  1. the client fills its source buffer with the ping pattern and Sends the
//     source buffer's advertisement;
//  2. the server RDMA Reads that many bytes into its own buffer, then Sends a
//     16-byte "go ahead";
//  3. the client Sends the advertisement of its sink buffer;
//  4. the server RDMA Writes strlen(data)+1 bytes of what it read there, then
//     Sends another "go ahead";
//  5. the client compares the sink with the source.
//
// The end is a plain disconnect (TCP FIN both ways, no Terminate). Unlike
// rping, whose programs exit 0 on any disconnect, Client and Server here
// return nil only when every iteration moved and verified its data.
//
// Interop facts (the rping server reads with its own -S; MPA revision 1
// gives an rping server ORD 0; siw's accept race) are in
// ../interop/README.md.
package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/rnic-dev/rnic/rnic"
)

// Defaults of rping (rping.c: port 7174, size 64, minimum size, maximum 64 KiB-1).
const (
	DefaultPort = 7174
	DefaultSize = 64
	MinSize     = 26 // sizeof("2147483647") + sizeof("rdma-ping-%d: ") in rping.c
	MaxSize     = 65535
	advertLen   = 16
)

// Pattern fills buf with what rping's client sends in ping number i:
// "rdma-ping-%d: " (truncated like snprintf), then the ASCII characters
// 'A'..'z' in rotation starting at 'A'+(i mod 58), and a NUL last byte.
func Pattern(buf []byte, i int) {
	if len(buf) == 0 {
		return
	}
	prefix := fmt.Sprintf("rdma-ping-%d: ", i)
	n := copy(buf[:len(buf)-1], prefix)
	c := byte('A' + i%58)
	for j := n; j < len(buf)-1; j++ {
		buf[j] = c
		if c++; c > 'z' {
			c = 'A'
		}
	}
	buf[len(buf)-1] = 0
}

// Advert is rping's buffer advertisement (struct rping_rdma_info).
type Advert struct {
	Addr uint64
	STag rnic.STag
	Size uint32
}

func (a Advert) encode(b []byte) {
	binary.BigEndian.PutUint64(b[0:], a.Addr)
	binary.BigEndian.PutUint32(b[8:], uint32(a.STag))
	binary.BigEndian.PutUint32(b[12:], a.Size)
}

func decodeAdvert(b []byte) (Advert, error) {
	if len(b) < advertLen {
		return Advert{}, fmt.Errorf("rping: advertisement of %d bytes, want %d", len(b), advertLen)
	}
	return Advert{
		Addr: binary.BigEndian.Uint64(b[0:]),
		STag: rnic.STag(binary.BigEndian.Uint32(b[8:])),
		Size: binary.BigEndian.Uint32(b[12:]),
	}, nil
}

// Options are the knobs both roles share; their names follow rping's flags.
type Options struct {
	Size    int       // -S: bytes per ping (client: sent; server: the largest accepted)
	Count   int       // -C: pings (client); the server stops after Count pings when > 0
	Verbose io.Writer // -v: ping data lines go here when non-nil
	Logger  *slog.Logger

	// Connection set-up. Rev is the MPA revision (1 or 2, default 2); CRC
	// asks for MPA CRCs (the peer may still ask for them). IRD/ORD default 1,
	// as rping's rdma_connect.
	Rev      int
	CRC      bool
	IRD, ORD int

	// Settle is how long the client waits after the MPA Reply before its
	// first FPDU. Linux siw as a responder attaches its receive path to the
	// socket only after sending the Reply; an FPDU that arrives in between
	// sits unread (see ../interop/README.md). Default 300ms; negative: none.
	Settle time.Duration
}

func (o *Options) defaults() error {
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Size < MinSize || o.Size > MaxSize {
		return fmt.Errorf("rping: size %d out of range [%d, %d]", o.Size, MinSize, MaxSize)
	}
	if o.Count < 0 {
		return fmt.Errorf("rping: negative count %d", o.Count)
	}
	if o.Rev == 0 {
		o.Rev = 2
	}
	if o.Rev != 1 && o.Rev != 2 {
		return fmt.Errorf("rping: MPA revision %d (want 1 or 2)", o.Rev)
	}
	if o.IRD == 0 {
		o.IRD = 1
	}
	if o.ORD == 0 {
		o.ORD = 1
	}
	if o.Settle == 0 {
		o.Settle = 300 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Stats is what a run did.
type Stats struct {
	Pings    int // iterations that moved and verified their data
	Bytes    int64
	Duration time.Duration
	Conn     *rnic.ConnInfo
}

// VA of the first byte of each buffer, as rping advertises virtual addresses.
const (
	vaSource = 0x0000_5000_0000_0000
	vaSink   = 0x0000_5000_0100_0000
	vaMsg    = 0x0000_5000_0200_0000
)

// endpoint is one side's resources: a PD, CQs, a QP, and registered buffers.
type endpoint struct {
	pd               *rnic.PD
	cq               *rnic.CQ
	qp               *rnic.QP
	recvBuf, sendBuf []byte
	recvMR, sendMR   *rnic.MR
	data, sink       []byte
	dataMR, sinkMR   *rnic.MR
	wcs              []rnic.WC
	nextRecv, nextWR uint64
	opts             *Options
	pendingRecvs     int
	msgs             [][advertLen]byte // received, not yet consumed
}

func newEndpoint(dev *rnic.Device, o *Options) (_ *endpoint, err error) {
	e := &endpoint{opts: o, wcs: make([]rnic.WC, 8)}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("rping: %w", err)
	}
	if e.cq, err = dev.CreateCQ(64, 0); err != nil {
		return nil, fmt.Errorf("rping: %w", err)
	}
	if e.qp, err = e.pd.CreateQP(rnic.QPConfig{
		SendCQ: e.cq, RecvCQ: e.cq, SQDepth: 16, RQDepth: 4, MaxSendSGE: 1, MaxRecvSGE: 1,
		IRD: o.IRD, ORD: o.ORD, InboundRead: true, InboundWrite: true,
	}); err != nil {
		return nil, fmt.Errorf("rping: %w", err)
	}
	reg := func(n int, va uint64, acc rnic.Access) ([]byte, *rnic.MR, error) {
		b := make([]byte, n)
		mr, err := e.pd.RegisterMR(rnic.Bytes(b), rnic.MROptions{Access: acc, VA: va})
		if err != nil {
			return nil, nil, fmt.Errorf("rping: register %d bytes: %w", n, err)
		}
		return b, mr, nil
	}
	if e.recvBuf, e.recvMR, err = reg(advertLen*4, vaMsg, rnic.LocalWrite); err != nil {
		return nil, err
	}
	if e.sendBuf, e.sendMR, err = reg(advertLen, vaMsg+0x1000, rnic.LocalRead); err != nil {
		return nil, err
	}
	if e.data, e.dataMR, err = reg(o.Size, vaSource, rnic.LocalRead|rnic.LocalWrite|rnic.RemoteRead|rnic.RemoteWrite); err != nil {
		return nil, err
	}
	if e.sink, e.sinkMR, err = reg(o.Size, vaSink, rnic.LocalRead|rnic.LocalWrite|rnic.RemoteWrite); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *endpoint) close() {
	if e.qp != nil {
		e.qp.Destroy()
	}
	for _, mr := range []*rnic.MR{e.recvMR, e.sendMR, e.dataMR, e.sinkMR} {
		if mr != nil {
			mr.Dealloc()
		}
	}
	if e.cq != nil {
		e.cq.Destroy()
	}
	if e.pd != nil {
		e.pd.Dealloc()
	}
}

// postRecv posts a receive for one 16-byte message (rping posts one).
func (e *endpoint) postRecv() error {
	slot := e.nextRecv % 4
	e.nextRecv++
	_, err := e.qp.PostRecv(rnic.RecvWR{ID: slot, SGL: []rnic.SGE{{
		STag: e.recvMR.STag(), TO: vaMsg + slot*advertLen, Len: advertLen}}})
	if err != nil {
		return fmt.Errorf("rping: post receive: %w", err)
	}
	e.pendingRecvs++
	return nil
}

// send Sends the 16-byte message in sendBuf and waits for its completion.
func (e *endpoint) send(ctx context.Context) error {
	e.nextWR++
	if _, err := e.qp.PostSend(rnic.SendWR{ID: e.nextWR, Op: rnic.WRSend,
		SGL: []rnic.SGE{{STag: e.sendMR.STag(), TO: vaMsg + 0x1000, Len: advertLen}}}); err != nil {
		return fmt.Errorf("rping: post send: %w", err)
	}
	_, err := e.waitSend(ctx, rnic.WRSend)
	return err
}

// wait returns the next completion; receive completions are counted.
func (e *endpoint) next(ctx context.Context) (rnic.WC, error) {
	n, err := e.cq.Wait(ctx, e.wcs[:1])
	if err != nil {
		return rnic.WC{}, fmt.Errorf("rping: waiting for a completion: %w", err)
	}
	if n == 0 {
		return rnic.WC{}, errors.New("rping: CQ wait returned nothing")
	}
	wc := e.wcs[0]
	if wc.Op == rnic.WRRecv {
		e.pendingRecvs--
	}
	if wc.Status != rnic.StatusSuccess {
		return wc, fmt.Errorf("rping: %v completion: %w", wc.Op, &rnic.CompletionError{WC: wc})
	}
	return wc, nil
}

// waitSend waits for the completion of the send-queue WR just posted (rping
// keeps one in flight). The peer's answer may complete first: messages that
// arrive meanwhile are queued for waitRecv.
func (e *endpoint) waitSend(ctx context.Context, op rnic.WROp) (rnic.WC, error) {
	for {
		wc, err := e.next(ctx)
		if err != nil {
			return wc, err
		}
		if wc.Op == rnic.WRRecv {
			if err := e.queue(wc); err != nil {
				return wc, err
			}
			continue
		}
		if wc.Op != op || wc.ID != e.nextWR {
			return wc, fmt.Errorf("rping: expected the completion of %v %d, got %v %d", op, e.nextWR, wc.Op, wc.ID)
		}
		return wc, nil
	}
}

func (e *endpoint) queue(wc rnic.WC) error {
	if wc.Bytes != advertLen {
		return fmt.Errorf("rping: received a %d-byte message, want %d", wc.Bytes, advertLen)
	}
	off := wc.ID * advertLen
	e.msgs = append(e.msgs, [advertLen]byte(e.recvBuf[off:off+advertLen]))
	return nil
}

// waitRecv waits for the next 16-byte message and returns it.
func (e *endpoint) waitRecv(ctx context.Context) ([]byte, error) {
	for len(e.msgs) == 0 {
		wc, err := e.next(ctx)
		if err != nil {
			return nil, err
		}
		if wc.Op != rnic.WRRecv {
			return nil, fmt.Errorf("rping: unexpected %v completion (id %d)", wc.Op, wc.ID)
		}
		if err := e.queue(wc); err != nil {
			return nil, err
		}
	}
	m := e.msgs[0]
	e.msgs = e.msgs[1:]
	return m[:], nil
}

// Client pings the rping server at addr (host:port) o.Count times (default
// 1, rping's 0 meaning "forever" is not offered) and verifies every echo.
func Client(ctx context.Context, dev *rnic.Device, addr string, o Options) (Stats, error) {
	if err := o.defaults(); err != nil {
		return Stats{}, err
	}
	if o.Count == 0 {
		o.Count = 1
	}
	e, err := newEndpoint(dev, &o)
	if err != nil {
		return Stats{}, err
	}
	defer e.close()
	if err := e.postRecv(); err != nil {
		return Stats{}, err
	}
	info, err := dev.Connect(ctx, e.qp, addr, rnic.ConnParams{Rev: o.Rev, NoCRC: !o.CRC, IRD: o.IRD, ORD: o.ORD})
	if err != nil {
		return Stats{}, fmt.Errorf("rping: connect %s: %w", addr, err)
	}
	st := Stats{Conn: info}
	o.Logger.Info("rping: connected", "peer", addr, "rev", info.Rev, "crc", info.CRC,
		"peer_ird", info.PeerIRD, "peer_ord", info.PeerORD, "mulpdu", info.MULPDU)
	if o.Settle > 0 {
		select {
		case <-time.After(o.Settle):
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
	start := time.Now()
	for i := 0; i < o.Count; i++ {
		if err := clientPing(ctx, e, i); err != nil {
			st.Duration = time.Since(start)
			return st, fmt.Errorf("ping %d: %w", i, err)
		}
		st.Pings++
		st.Bytes += int64(o.Size)
	}
	st.Duration = time.Since(start)
	if err := disconnect(ctx, e.qp); err != nil {
		o.Logger.Debug("rping: peer did not close", "err", err)
	}
	return st, nil
}

// disconnect is rdma_disconnect: a graceful close (FIN), then the wait, at
// most 5 s, for the connection to end, in Idle (the peer closed too) or in
// Error (it reset the connection, or the close failed).
func disconnect(ctx context.Context, qp *rnic.QP) error {
	if err := qp.Modify(rnic.StateClosing, rnic.ModifyAttrs{}); err != nil {
		return fmt.Errorf("rping: close: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := qp.WaitState(wctx, rnic.StateIdle, rnic.StateError); err != nil {
		return fmt.Errorf("rping: %w", err)
	}
	return nil
}

func clientPing(ctx context.Context, e *endpoint, i int) error {
	o := e.opts
	Pattern(e.data, i)
	clear(e.sink)
	// Source advertisement; the server RDMA Reads it and says "go ahead".
	Advert{Addr: vaSource, STag: e.dataMR.STag(), Size: uint32(o.Size)}.encode(e.sendBuf)
	if err := e.send(ctx); err != nil {
		return err
	}
	if _, err := e.waitRecv(ctx); err != nil {
		return fmt.Errorf("waiting for the go-ahead after the read: %w", err)
	}
	if err := e.postRecv(); err != nil {
		return err
	}
	// Sink advertisement; the server RDMA Writes the data back.
	Advert{Addr: vaSink, STag: e.sinkMR.STag(), Size: uint32(o.Size)}.encode(e.sendBuf)
	if err := e.send(ctx); err != nil {
		return err
	}
	if _, err := e.waitRecv(ctx); err != nil {
		return fmt.Errorf("waiting for the go-ahead after the write: %w", err)
	}
	if err := e.postRecv(); err != nil {
		return err
	}
	if !bytes.Equal(e.sink, e.data) {
		at := 0
		for at < len(e.sink) && e.sink[at] == e.data[at] {
			at++
		}
		return fmt.Errorf("rping: data mismatch at byte %d of %d: got %q, sent %q", at, len(e.data),
			clip(e.sink[at:]), clip(e.data[at:]))
	}
	if o.Verbose != nil {
		fmt.Fprintf(o.Verbose, "ping data: %s\n", cstring(e.sink))
	}
	return nil
}

func clip(b []byte) []byte { return b[:min(len(b), 32)] }

func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// Server answers rping clients that connect to ln, one at a time, as
// rping -s does (without -P). It returns after the first client when
// once is set, otherwise when ctx ends. A client's run fails when a read
// or write fails or its data is not rping's pattern; the server
// verifies that pattern because Pattern is deterministic.
func Server(ctx context.Context, dev *rnic.Device, ln *rnic.Listener, o Options, once bool) (Stats, error) {
	if err := o.defaults(); err != nil {
		return Stats{}, err
	}
	var total Stats
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil && !once {
				return total, nil
			}
			return total, fmt.Errorf("rping: accept: %w", err)
		}
		st, err := ServeConn(ctx, dev, req, o)
		total.Pings += st.Pings
		total.Bytes += st.Bytes
		total.Duration += st.Duration
		total.Conn = st.Conn
		if once {
			return total, err
		}
		if err != nil {
			o.Logger.Warn("rping: client failed", "peer", req.RemoteAddr, "err", err)
		}
	}
}

// ServeConn accepts one connection request and serves it until the client
// disconnects (or, when o.Count > 0, after that many pings and the
// client's disconnect).
func ServeConn(ctx context.Context, dev *rnic.Device, req *rnic.ConnRequest, o Options) (st Stats, err error) {
	if err := o.defaults(); err != nil {
		req.Reject(nil)
		return Stats{}, err
	}
	e, err := newEndpoint(dev, &o)
	if err != nil {
		req.Reject(nil)
		return Stats{}, err
	}
	defer e.close()
	if err := e.postRecv(); err != nil {
		req.Reject(nil)
		return Stats{}, err
	}
	// rping's rdma_accept(NULL) answers the request's IRD/ORD (clamped); we
	// answer with ours, which is what a revision 1 peer cannot tell us.
	ird, ord := o.IRD, o.ORD
	if req.Enhanced {
		ird, ord = min(max(req.PeerORD, 1), o.IRD), min(max(req.PeerIRD, 1), o.ORD)
	}
	info, err := req.Accept(ctx, e.qp, rnic.AcceptParams{NoCRC: !o.CRC && !req.CRC, IRD: ird, ORD: ord})
	if err != nil {
		return Stats{}, fmt.Errorf("rping: accept %v: %w", req.RemoteAddr, err)
	}
	st.Conn = info
	o.Logger.Info("rping: client connected", "peer", req.RemoteAddr, "rev", info.Rev, "crc", info.CRC,
		"peer_ird", info.PeerIRD, "peer_ord", info.PeerORD)
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	for i := 0; o.Count == 0 || i < o.Count; i++ {
		done, err := serverPing(ctx, e, i)
		if done {
			// The client disconnected while we waited for an advertisement.
			if o.Count > 0 && i < o.Count {
				return st, fmt.Errorf("rping: client left after %d of %d pings", i, o.Count)
			}
			if i == 0 {
				return st, errors.New("rping: client left before the first ping")
			}
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("ping %d: %w", i, err)
		}
		st.Pings++
		st.Bytes += int64(o.Size)
	}
	// Wait for the client's disconnect.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.waitRecv(wctx); err == nil {
		return st, errors.New("rping: client kept pinging past the count")
	}
	return st, nil
}

// serverPing serves one iteration. done reports that the connection ended
// cleanly while waiting for the first advertisement.
func serverPing(ctx context.Context, e *endpoint, i int) (done bool, err error) {
	o := e.opts
	msg, err := e.waitRecv(ctx)
	if err != nil {
		var ce *rnic.CompletionError
		if errors.As(err, &ce) && ce.WC.Status == rnic.StatusFlushed {
			return true, nil
		}
		return false, fmt.Errorf("waiting for the source advertisement: %w", err)
	}
	src, err := decodeAdvert(msg)
	if err != nil {
		return false, err
	}
	if src.Size > uint32(len(e.data)) || src.Size < 2 {
		return false, fmt.Errorf("rping: client advertises %d bytes, this server takes %d..%d (-S)", src.Size, 2, len(e.data))
	}
	if err := e.postRecv(); err != nil {
		return false, err
	}
	n := src.Size
	e.nextWR++
	if _, err := e.qp.PostSend(rnic.SendWR{ID: e.nextWR, Op: rnic.WRRead,
		Local:  rnic.SGE{STag: e.dataMR.STag(), TO: vaSource, Len: n},
		Remote: rnic.RemoteAddr{STag: src.STag, TO: src.Addr}}); err != nil {
		return false, fmt.Errorf("rping: post RDMA Read: %w", err)
	}
	if _, err := e.waitSend(ctx, rnic.WRRead); err != nil {
		return false, err
	}
	want := make([]byte, n)
	Pattern(want, i)
	if !bytes.Equal(e.data[:n], want) {
		return false, fmt.Errorf("rping: read data is not ping %d's pattern: %q", i, clip(e.data[:n]))
	}
	if o.Verbose != nil {
		fmt.Fprintf(o.Verbose, "server ping data: %s\n", cstring(e.data[:n]))
	}
	clear(e.sendBuf) // rping's go-ahead is its never-written send buffer
	if err := e.send(ctx); err != nil {
		return false, err
	}
	msg, err = e.waitRecv(ctx)
	if err != nil {
		return false, fmt.Errorf("waiting for the sink advertisement: %w", err)
	}
	sink, err := decodeAdvert(msg)
	if err != nil {
		return false, err
	}
	if err := e.postRecv(); err != nil {
		return false, err
	}
	wn := uint32(len(cstring(e.data[:n]))) + 1
	if wn > n {
		wn = n
	}
	if sink.Size < wn {
		return false, fmt.Errorf("rping: client's sink holds %d bytes, the echo is %d", sink.Size, wn)
	}
	e.nextWR++
	if _, err := e.qp.PostSend(rnic.SendWR{ID: e.nextWR, Op: rnic.WRWrite,
		SGL:    []rnic.SGE{{STag: e.dataMR.STag(), TO: vaSource, Len: wn}},
		Remote: rnic.RemoteAddr{STag: sink.STag, TO: sink.Addr}}); err != nil {
		return false, fmt.Errorf("rping: post RDMA Write: %w", err)
	}
	if _, err := e.waitSend(ctx, rnic.WRWrite); err != nil {
		return false, err
	}
	clear(e.sendBuf)
	if err := e.send(ctx); err != nil {
		return false, err
	}
	return false, nil
}
