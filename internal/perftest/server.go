// Package perftest is a server for the bandwidth tests of linux-rdma's
// perftest run with rdma_cm (-R): ib_write_bw, ib_read_bw and ib_send_bw
// connect to it and run to the end, as they would against another perftest
// server. Speed is not the point (the tests are used for interoperability);
// the protocol is.
//
// With -R perftest has no TCP side channel: it makes two iWARP connections
// to the same port (see ../interop/README.md, "perftest -R"):
//
//   - the first ("comm") carries the parameter exchange as RDMA Sends. The
//     client always Sends first and the server answers with a message of
//     the same size: a 16-byte version string, two be32 values, the MTU as a
//     2-byte string, 56-byte pingpong_dest handshakes, five 8-byte report
//     values, and a last handshake;
//   - the second ("data") carries the test: RDMA Writes into, or RDMA Reads
//     from, the buffer the server's pingpong_dest advertises, or Sends that
//     the server receives while RDMA-Writing its receive count (a
//     little-endian u32) into the client's credit buffer.
//
// The server answers each comm message by its size: its own pingpong_dest
// for a 56-byte handshake, the same bytes back for anything else (the
// client's version, cycle buffer, cache line, MTU and report values: the
// server's values are only printed by the client).
package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/rnic-dev/rnic/rnic"
)

// DefaultPort is perftest's default port.
const DefaultPort = 18515

// Test is the kind of test a server answers.
type Test string

const (
	Write Test = "write"
	Read  Test = "read"
	Send  Test = "send"
)

// Options configure a server.
type Options struct {
	Test    Test
	MaxSize int // largest message (perftest -s); default 65536
	Logger  *slog.Logger
}

// Stats are what one client did.
type Stats struct {
	CommMessages int   // comm messages answered
	Received     int   // ib_send_bw: Sends received on the data QP
	Bytes        int64 // ib_send_bw: bytes received
	Credits      int   // ib_send_bw: credit writes sent
	DataConn     bool  // the data connection was established
}

const (
	destLen     = 56
	commBufLen  = 256
	commRecvs   = 16
	sendRecvs   = 1024 // > perftest's largest rx_depth (512)
	bufVA       = 0x0000_6000_0000_0000
	creditVA    = 0x0000_6100_0000_0000
	regionBytes = 1 << 24 // perftest cycles its remote address within 2 x max(size, cycle buffer)
	creditSlots = 256     // one 4-byte source per credit write in flight (at most half of them)
)

// dest is perftest's struct pingpong_dest as it crosses the wire (56
// bytes, big-endian fields; bytes 20-23 are struct padding).
type dest []byte

func (d dest) OutReads() uint32 { return binary.BigEndian.Uint32(d[4:]) }
func (d dest) RKey() uint32     { return binary.BigEndian.Uint32(d[16:]) }
func (d dest) VAddr() uint64    { return binary.BigEndian.Uint64(d[24:]) }

type destFields struct {
	OutReads, QPN, PSN, RKey uint32
	VAddr                    uint64
}

func (d dest) encode(f destFields) {
	clear(d[:destLen])
	binary.BigEndian.PutUint32(d[4:], f.OutReads)
	binary.BigEndian.PutUint32(d[8:], f.QPN)
	binary.BigEndian.PutUint32(d[12:], f.PSN)
	binary.BigEndian.PutUint32(d[16:], f.RKey)
	binary.BigEndian.PutUint64(d[24:], f.VAddr)
}

// Serve answers one perftest client on ln: it accepts the comm connection
// and the data connection and returns when the client closes the comm
// connection after the test.
func Serve(ctx context.Context, dev *rnic.Device, ln *rnic.Listener, o Options) (Stats, error) {
	if o.MaxSize == 0 {
		o.MaxSize = 65536
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch o.Test {
	case Write, Read, Send:
	default:
		return Stats{}, fmt.Errorf("perftest: unknown test %q (write, read or send)", o.Test)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &server{o: o, dev: dev}
	defer s.close()
	if err := s.setup(); err != nil {
		return Stats{}, err
	}

	req, err := ln.Accept(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("perftest: accept comm connection: %w", err)
	}
	if err := s.accept(ctx, req, s.comm); err != nil {
		return Stats{}, fmt.Errorf("perftest: comm connection: %w", err)
	}
	// The data connection arrives during the comm exchange.
	dataErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, err := ln.Accept(ctx)
		if err != nil {
			dataErr <- fmt.Errorf("perftest: accept data connection: %w", err)
			return
		}
		if err := s.accept(ctx, req, s.data); err != nil {
			dataErr <- fmt.Errorf("perftest: data connection: %w", err)
			return
		}
		s.mu.Lock()
		s.st.DataConn = true
		s.mu.Unlock()
		if o.Test == Send {
			dataErr <- s.receive(ctx)
			return
		}
		dataErr <- nil
	}()
	err = s.answer(ctx)
	s.data.qp.Modify(rnic.StateClosing, rnic.ModifyAttrs{})
	cancel()
	wg.Wait()
	s.mu.Lock()
	st := s.st
	s.mu.Unlock()
	if derr := <-dataErr; err == nil && derr != nil && !errors.Is(derr, context.Canceled) {
		err = derr
	}
	if err == nil && !st.DataConn {
		err = errors.New("perftest: the client never opened the data connection")
	}
	return st, err
}

type qpEnd struct {
	cq *rnic.CQ
	qp *rnic.QP
}

type server struct {
	o    Options
	dev  *rnic.Device
	pd   *rnic.PD
	comm qpEnd
	data qpEnd

	commBuf, buf, credit    []byte
	commMR, bufMR, creditMR *rnic.MR

	mu       sync.Mutex
	st       Stats
	peerDest destFields // the client's latest handshake with an rkey
}

func (s *server) setup() (err error) {
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return fmt.Errorf("perftest: %w", err)
	}
	mk := func(e *qpEnd, depth int, read bool) error {
		var err error
		if e.cq, err = s.dev.CreateCQ(4*depth, 0); err != nil {
			return fmt.Errorf("perftest: %w", err)
		}
		ird := 1
		if read {
			ird = s.dev.Query().MaxIRD
		}
		if e.qp, err = s.pd.CreateQP(rnic.QPConfig{SendCQ: e.cq, RecvCQ: e.cq, SQDepth: 256, RQDepth: depth,
			MaxSendSGE: 1, MaxRecvSGE: 1, IRD: ird, ORD: 1, InboundRead: true, InboundWrite: true}); err != nil {
			return fmt.Errorf("perftest: %w", err)
		}
		return nil
	}
	if err := mk(&s.comm, commRecvs, false); err != nil {
		return err
	}
	if err := mk(&s.data, sendRecvs, s.o.Test == Read); err != nil {
		return err
	}
	reg := func(n int, va uint64, acc rnic.Access) ([]byte, *rnic.MR, error) {
		b := make([]byte, n)
		mr, err := s.pd.RegisterMR(rnic.Bytes(b), rnic.MROptions{Access: acc, VA: va})
		if err != nil {
			return nil, nil, fmt.Errorf("perftest: register %d bytes: %w", n, err)
		}
		return b, mr, nil
	}
	if s.commBuf, s.commMR, err = reg(commBufLen*2*commRecvs, bufVA-1<<20, rnic.LocalRead|rnic.LocalWrite); err != nil {
		return err
	}
	if s.buf, s.bufMR, err = reg(regionBytes+2*s.o.MaxSize, bufVA, rnic.LocalRead|rnic.LocalWrite|rnic.RemoteRead|rnic.RemoteWrite); err != nil {
		return err
	}
	if s.credit, s.creditMR, err = reg(4*creditSlots, creditVA, rnic.LocalRead); err != nil {
		return err
	}
	for i := 0; i < commRecvs; i++ {
		if err := s.postComm(uint64(i)); err != nil {
			return err
		}
	}
	if s.o.Test == Send {
		for i := 0; i < sendRecvs; i++ {
			if err := s.postData(uint64(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *server) close() {
	for _, e := range []qpEnd{s.comm, s.data} {
		if e.qp != nil {
			e.qp.Destroy()
		}
	}
	for _, mr := range []*rnic.MR{s.commMR, s.bufMR, s.creditMR} {
		if mr != nil {
			mr.Dealloc()
		}
	}
	for _, e := range []qpEnd{s.comm, s.data} {
		if e.cq != nil {
			e.cq.Destroy()
		}
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

func (s *server) postComm(slot uint64) error {
	_, err := s.comm.qp.PostRecv(rnic.RecvWR{ID: slot, SGL: []rnic.SGE{{STag: s.commMR.STag(),
		TO: bufVA - 1<<20 + slot*commBufLen, Len: commBufLen}}})
	if err != nil {
		return fmt.Errorf("perftest: post comm receive: %w", err)
	}
	return nil
}

// postData posts a receive for one ib_send_bw message; they all land in the
// start of the buffer (their content is not looked at).
func (s *server) postData(id uint64) error {
	_, err := s.data.qp.PostRecv(rnic.RecvWR{ID: id, SGL: []rnic.SGE{{STag: s.bufMR.STag(), TO: bufVA, Len: uint32(s.o.MaxSize)}}})
	if err != nil {
		return fmt.Errorf("perftest: post data receive: %w", err)
	}
	return nil
}

func (s *server) accept(ctx context.Context, req *rnic.ConnRequest, e qpEnd) error {
	ird := 1
	if s.o.Test == Read && e.qp == s.data.qp {
		// MPA revision 1 carries no ORD: allow as many Reads as we can.
		ird = s.dev.Query().MaxIRD
		if req.Enhanced {
			ird = min(max(req.PeerORD, 1), ird)
		}
	}
	info, err := req.Accept(ctx, e.qp, rnic.AcceptParams{NoCRC: !req.CRC, IRD: ird, ORD: 1})
	if err != nil {
		return err
	}
	s.o.Logger.Info("perftest: connection", "peer", req.RemoteAddr, "qp", e.qp.ID(), "rev", info.Rev, "crc", info.CRC,
		"peer_ird", info.PeerIRD, "peer_ord", info.PeerORD)
	return nil
}

// answer serves the comm connection until the client closes it.
func (s *server) answer(ctx context.Context) error {
	wcs := make([]rnic.WC, 8)
	var sendID uint64
	for {
		n, err := s.comm.cq.Wait(ctx, wcs[:1])
		if err != nil {
			return fmt.Errorf("perftest: comm: %w", err)
		}
		if n == 0 {
			continue
		}
		wc := wcs[0]
		if wc.Status != rnic.StatusSuccess {
			if wc.Status == rnic.StatusFlushed {
				return nil // the client closed the comm connection
			}
			return fmt.Errorf("perftest: comm %v: %w", wc.Op, &rnic.CompletionError{WC: wc})
		}
		if wc.Op != rnic.WRRecv {
			continue // an answer's completion
		}
		// Answers rotate through commRecvs slots: the client Sends its next
		// message only after our answer arrived, so a slot is long free when
		// it comes round again.
		slot := uint64(commRecvs) + sendID%commRecvs
		reply := s.commBuf[slot*commBufLen : (slot+1)*commBufLen]
		replyTO := bufVA - 1<<20 + slot*commBufLen
		msg := s.commBuf[wc.ID*commBufLen : wc.ID*commBufLen+uint64(wc.Bytes)]
		ours := destFields{OutReads: uint32(s.dev.Query().MaxIRD), QPN: s.data.qp.ID(), PSN: 0x1000,
			RKey: uint32(s.bufMR.STag()), VAddr: bufVA}
		if s.o.Test == Send {
			ours.RKey, ours.VAddr = uint32(s.creditMR.STag()), creditVA
		}
		size, peer, err := commAnswer(msg, reply, ours)
		if err != nil {
			return err
		}
		if peer != nil {
			s.mu.Lock()
			s.peerDest = *peer
			s.mu.Unlock()
		}
		if err := s.postComm(wc.ID); err != nil {
			return err
		}
		sendID++
		if _, err := s.comm.qp.PostSend(rnic.SendWR{ID: sendID, Op: rnic.WRSend,
			SGL: []rnic.SGE{{STag: s.commMR.STag(), TO: replyTO, Len: uint32(size)}}}); err != nil {
			return fmt.Errorf("perftest: comm answer: %w", err)
		}
		s.mu.Lock()
		s.st.CommMessages++
		s.mu.Unlock()
	}
}

// commAnswer writes into reply the answer to msg, a message the client sent
// on the comm connection, and returns the answer's length. A message of
// destLen bytes is the client's handshake (its struct pingpong_dest): the
// answer is ours, and peer is the client's when it names a buffer (an
// rkey or an address). Any other message (perftest's sync barriers) is
// echoed, if it fits.
func commAnswer(msg, reply []byte, ours destFields) (size int, peer *destFields, err error) {
	switch len(msg) {
	case destLen:
		if len(reply) < destLen {
			return 0, nil, fmt.Errorf("perftest: answer buffer of %d bytes, want %d", len(reply), destLen)
		}
		d := dest(msg)
		if d.RKey() != 0 || d.VAddr() != 0 {
			peer = &destFields{OutReads: d.OutReads(), RKey: d.RKey(), VAddr: d.VAddr()}
		}
		dest(reply).encode(ours)
	default:
		if len(msg) > len(reply) {
			return 0, nil, fmt.Errorf("perftest: comm message of %d bytes, at most %d", len(msg), len(reply))
		}
		copy(reply, msg)
	}
	return len(msg), peer, nil
}

// receive runs ib_send_bw's server side: count the Sends, repost the
// receives, and write the count into the client's credit buffer.
func (s *server) receive(ctx context.Context) error {
	wcs := make([]rnic.WC, 64)
	var rcnt, credited uint32
	var writes, outstanding int
	for {
		n, err := s.data.cq.Wait(ctx, wcs)
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rnic.StatusSuccess {
				if wc.Status == rnic.StatusFlushed {
					return nil // the client closed the data connection
				}
				return fmt.Errorf("perftest: data %v: %w", wc.Op, &rnic.CompletionError{WC: wc})
			}
			if wc.Op == rnic.WRWrite {
				outstanding--
				continue
			}
			rcnt++
			s.mu.Lock()
			s.st.Received++
			s.st.Bytes += int64(wc.Bytes)
			s.mu.Unlock()
			if err := s.postData(wc.ID); err != nil {
				return err
			}
		}
		s.mu.Lock()
		peer := s.peerDest
		s.mu.Unlock()
		if rcnt != credited && peer.RKey != 0 && outstanding < creditSlots/2 {
			slot := uint64(writes % creditSlots)
			binary.LittleEndian.PutUint32(s.credit[4*slot:], rcnt)
			writes++
			if _, err := s.data.qp.PostSend(rnic.SendWR{ID: uint64(writes), Op: rnic.WRWrite,
				SGL:    []rnic.SGE{{STag: s.creditMR.STag(), TO: creditVA + 4*slot, Len: 4}},
				Remote: rnic.RemoteAddr{STag: rnic.STag(peer.RKey), TO: peer.VAddr}}); err != nil {
				return fmt.Errorf("perftest: credit write: %w", err)
			}
			outstanding++
			credited = rcnt
			s.mu.Lock()
			s.st.Credits++
			s.mu.Unlock()
		}
	}
}
