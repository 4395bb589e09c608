package nvmf

import (
	"context"
	"errors"
	"fmt"

	"github.com/rnic-dev/rnic/rnic"
)

// accept answers one MPA connection request: its private data must be an
// NVMe/RDMA CM request (cm.go), then a queue is made with its receives
// posted, and the MPA Reply carries the CM reply: the controller's receive
// queue size (the host's submission queue size), IRD 0 (the host never
// reads controller memory) and our ORD, the RDMA Reads a queue keeps
// outstanding (on MPA revision 2 the engine lowers it to the host's IRD;
// revision 1 carries no IRD/ORD and the host's siw keeps its default of
// 128). A refused request gets an MPA Reply with Reject and the CM reject
// private data (Linux siw reports any reject as a reset, but other hosts
// read it).
func (s *Server) accept(req *rnic.ConnRequest) {
	r, err := ParseCMRequest(req.PrivateData)
	if err != nil {
		var ce *CMRequestError
		st := CMRejectNoResources
		if errors.As(err, &ce) {
			st = ce.Status
		}
		s.reject(req, st, err)
		return
	}
	q, err := s.newQueue(r, req.RemoteAddr)
	if err != nil {
		s.reject(req, CMRejectNoResources, err)
		return
	}
	var rep [CMReplyLen]byte
	CMReply(rep[:]).Encode(&CMReplyFields{RecFmt: CMRecFmt, CRQSize: uint16(q.size)})
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	info, err := req.Accept(ctx, q.ep.QP, rnic.AcceptParams{PrivateData: rep[:], NoCRC: !s.cfg.CRC, ORD: s.cfg.ORD})
	cancel()
	if err != nil {
		s.m.ConnectFailures.Add(1)
		s.log.Info("accepting an NVMe/RDMA connection failed", "peer", req.RemoteAddr, "err", err)
		q.end("accept failed")
		return
	}
	q.info = info
	if si := q.ep.QP.Query().Stream; si != nil {
		q.local = si.Local
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		q.end("shutting down")
		return
	}
	s.queues[q] = struct{}{}
	s.mu.Unlock()
	s.m.Queues.Add(1)
	q.log.Debug("queue accepted", "size", q.size, "hrqsize", r.HRQSize(), "mpa_rev", info.Rev, "crc", info.CRC,
		"ord", q.ep.QP.Query().ORD)
	q.start()
}

// reject refuses a connection request with the CM reject private data.
func (s *Server) reject(req *rnic.ConnRequest, st CMRejectStatus, why error) {
	s.m.ConnectFailures.Add(1)
	s.log.Info("NVMe/RDMA connection rejected", "peer", req.RemoteAddr, "status", st, "err", why)
	var b [CMRejectLen]byte
	CMReject(b[:]).Encode(&CMRejectFields{RecFmt: CMRecFmt, Status: st})
	req.Reject(b[:])
}

// Shared is a listener shared by the native block protocol and NVMe/RDMA:
// one port (4420, the IANA port of NVMe/RDMA and the native default) for
// both, told apart by the MPA Request's private data (IsNVMeRequest).
// NVMe/RDMA requests go to the Server; the others wait for Accept, which
// target.Serve calls.
type Shared struct {
	l      *rnic.Listener
	native chan *rnic.ConnRequest
	done   chan struct{}
	err    error
}

// Share starts handing out l's connection requests. It stops when l is
// closed.
func Share(l *rnic.Listener, srv *Server) *Shared {
	sh := &Shared{l: l, native: make(chan *rnic.ConnRequest), done: make(chan struct{})}
	go func() {
		defer close(sh.done)
		for {
			req, err := l.Accept(context.Background())
			if err != nil {
				sh.err = err
				return
			}
			if IsNVMeRequest(req.PrivateData) {
				srv.Handle(req)
				continue
			}
			select {
			case sh.native <- req:
			case <-srv.stop:
				req.Reject(nil)
			}
		}
	}()
	return sh
}

// Accept returns the next native-protocol connection request.
func (sh *Shared) Accept(ctx context.Context) (*rnic.ConnRequest, error) {
	select {
	case r := <-sh.native:
		return r, nil
	case <-sh.done:
		return nil, fmt.Errorf("nvmf: shared listener: %w", sh.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
