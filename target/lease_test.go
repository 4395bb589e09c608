//go:build unix

package target

import (
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// pausingProxy forwards TCP connections to a target; while paused it
// reads nothing from the target, whose transmitter then blocks once the
// socket buffers are full: a peer that stopped reading.
type pausingProxy struct {
	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	conns  []net.Conn
}

func newPausingProxy(t *testing.T, target string) *pausingProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausingProxy{l: l}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() {
		p.resume()
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	// A small receive buffer towards the target: the stall needs few
	// bytes in flight.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	go func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := d.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, down, up)
			p.mu.Unlock()
			go func() {
				io.Copy(up, down)
				up.Close()
			}()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					p.mu.Lock()
					for p.paused {
						p.cond.Wait()
					}
					p.mu.Unlock()
					n, err := up.Read(buf)
					if n > 0 {
						if _, werr := down.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				down.Close()
			}()
		}
	}()
	return p
}

func (p *pausingProxy) pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

func (p *pausingProxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// TestLeaseExpiresBeforeFastRegister: a READY's Fast-Register is a work
// request, executed when the transmitter reaches it. When the lease of
// the exchange runs out before that (the send queue stalled behind a
// peer that stopped reading), the revocation must still win: once the
// stall clears, the buffer's STag must not read. Here the initiator holds
// slot 0's READY buffer and asks for 16 MiB of it with RDMA Reads, then
// stops reading (the proxy pauses); once the target's transmitter is
// blocked, slot 1's READ gets its READY queued behind those Read
// Responses, and its lease runs out.
func TestLeaseExpiresBeforeFastRegister(t *testing.T) {
	r := newRig(t, nil) // 30 s leases: slot 0's buffer must stay readable
	px := newPausingProxy(t, r.addr)
	r.via, r.peerORD = px.l.Addr().String(), 16
	r.fill(0, pattern(1<<20, 5))
	p := r.dial(4, 0)
	c := r.conn0()

	b0 := p.ready(blockproto.OpRead, 0, 1<<20, 0)
	px.pause()
	const reads = 16
	for range reads {
		p.post(rnic.SendWR{ID: readID, Op: rnic.WRRead, Local: rnic.SGE{STag: p.mr.STag(), Len: b0.Len},
			Remote: rnic.RemoteAddr{STag: rnic.STag(b0.STag), TO: b0.TO}})
	}
	// The target's transmitter blocks in a write once the sockets are
	// full of Read Responses: wait for that before the next command.
	r.waitFor("the target's transmitter to block", func() bool {
		return goroutineWith("rnic.(*txState).flush(", "waitWrite")
	})
	// The command's Send completes only after the Reads before it (the
	// send queue completes in order): it is not waited for.
	var cmd [blockproto.CommandLen]byte
	blockproto.Command(cmd[:]).Encode(&blockproto.CommandFields{Op: blockproto.OpRead, Tag: 1, Offset: 64 << 10, Length: 4096})
	n := copy(p.ep.Area(3), cmd[:])
	p.post(rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{p.ep.AreaSGE(3, n)}})

	// The lease of slot 1's exchange is running: it runs out now.
	s := &c.slots[1]
	r.waitFor("slot 1's lease", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.state == slotAwaitRelease && !s.deadline.IsZero()
	})
	s.mu.Lock()
	s.deadline = time.Now()
	s.mu.Unlock()
	s.expire()
	if n := r.tgt.m.LeaseExpired.Load(); n != 1 {
		t.Fatalf("LeaseExpired %d, want 1", n)
	}

	px.resume()
	for range reads {
		if wc := p.await(readID); wc.Status != rnic.StatusSuccess {
			t.Fatalf("RDMA Read of slot 0's buffer: %v", wc.Err())
		}
	}
	rd, err := blockproto.ParseReady(p.recv())
	if err != nil {
		t.Fatalf("expected slot 1's READY: %v", err)
	}
	b1 := rd.Buffer().Fields()
	if wc := p.rdmaRead(b1.STag, b1.TO, int(b1.Len)); wc.Status == rnic.StatusSuccess {
		t.Fatal("the buffer whose lease expired before its Fast-Register ran still reads")
	}
}
