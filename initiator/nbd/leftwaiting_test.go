package nbd

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestClientLeavingWhileReaderWaits: a client that leaves without
// NBD_CMD_DISC abandons its requests in flight also when the reader was
// not reading the socket as it left, but waiting for a request slot
// (MaxInFlight) or for payload budget (MaxInFlightBytes) with the
// client's next request half read: the Backend call still running sees
// its context cancelled with ErrClientGone. (Waiting for the slot, the
// reader learned of the departure only once a slot came free, when the
// write still waiting in the Backend, for a lost session say, had run:
// what the client was told nothing of was done after all, possibly over
// blocks it had written since through another connection.) A client
// that sends NBD_CMD_DISC after the requests the reader has not reached
// and then shuts its side down has disconnected softly: nothing is
// abandoned.
func TestClientLeavingWhileReaderWaits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		srv   func(be Backend) *Server
		disc  bool
		extra int // requests sent after the blocked one, besides the one the reader waits with
	}{
		{"slot", func(be Backend) *Server {
			return &Server{Exports: []Export{{Name: "x", Backend: be}}, MaxInFlight: 1}
		}, false, 3},
		{"budget", func(be Backend) *Server {
			return &Server{Exports: []Export{{Name: "x", Backend: be, MaxBlock: 64 << 10}}, MaxInFlightBytes: 64 << 10}
		}, false, 0},
		{"slot then disc", func(be Backend) *Server {
			return &Server{Exports: []Export{{Name: "x", Backend: be}}, MaxInFlight: 1}
		}, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMem(1 << 20)
			entered, release, cause := holdFirstWrite(m)
			srv := tc.srv(m)
			log := watchLog(t)
			srv.Logger = log.Logger
			s := serve(t, srv)
			c := dial(t, s.addr, clientFlagFixedNewstyle)
			c.goExport("x")
			c.send(CmdWrite, 0, 1, 0, 64<<10, pattern(64<<10, 1))
			<-entered
			// The reader takes this one's header and waits (for a slot
			// or for budget) before it reads its payload.
			c.send(CmdWrite, 0, 2, 64<<10, 64<<10, pattern(64<<10, 2))
			for i := range tc.extra {
				c.send(CmdRead, 0, uint64(3+i), 0, 4096, nil)
			}
			if tc.disc {
				c.send(CmdDisc, 0, 99, 0, 0, nil)
				if err := c.nc.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-cause:
					t.Fatalf("the write's context ended after NBD_CMD_DISC: %v", err)
				case <-time.After(500 * time.Millisecond):
				}
				close(release)
				if err := <-cause; err != nil {
					t.Fatalf("the write's context after NBD_CMD_DISC: %v, want none", err)
				}
				got := map[uint64]uint32{}
				for range 2 + tc.extra {
					r := c.reply()
					got[r.cookie] = r.errno
				}
				for k := uint64(1); k < uint64(3+tc.extra); k++ {
					if e, ok := got[k]; !ok || e != 0 {
						t.Errorf("request %d: replied %v, errno %d", k, ok, e)
					}
				}
				s.expectEnd(t, c, nil)
				return
			}
			c.nc.Close()
			select {
			case err := <-cause:
				if !errors.Is(err, ErrClientGone) {
					t.Fatalf("the write's context after the client left: cause %v, want ErrClientGone", err)
				}
			case <-time.After(5 * time.Second):
				close(release)
				t.Fatal("the client left while the reader waited: its write in flight was not abandoned within 5 s")
			}
			log.wait(t, abandonedMsg, 1)
		})
	}
}

// TestShortWaitsAreNotWatched: a client that keeps more requests in
// flight than MaxInFlight (the Linux kernel's NBD client keeps up to 128)
// makes the reader wait for a slot before nearly every request, for about
// one request's time. Such waits are not watched for the client leaving:
// a watch costs a descriptor and a thread blocked in poll, and watching
// every wait made the runtime start a thread for about every 70 requests
// (83-87 for 6,000 reads at MaxInFlight 2, against 1 now). Only a wait
// that lasts watchAfter is watched; here the Backend answers in 300 us,
// so at most a few waits (a machine that stalls) may be.
func TestShortWaitsAreNotWatched(t *testing.T) {
	m := newMem(1 << 20)
	m.hook = func(ctx context.Context, op string, off, n int64) error {
		time.Sleep(300 * time.Microsecond)
		return nil
	}
	log := watchLog(t)
	s := serve(t, &Server{Exports: []Export{{Name: "x", Backend: m}}, MaxInFlight: 2, Logger: log.Logger})
	c := dial(t, s.addr, clientFlagFixedNewstyle)
	c.goExport("x")
	const depth, total = 32, 3000
	sent := 0
	for ; sent < depth; sent++ {
		c.send(CmdRead, 0, uint64(sent), 0, 4096, nil)
	}
	for range total {
		if r := c.reply(); r.errno != 0 {
			t.Fatalf("read %d: errno %d", r.cookie, r.errno)
		}
		if sent < total {
			c.send(CmdRead, 0, uint64(sent), 0, 4096, nil)
			sent++
		}
	}
	log.mu.Lock()
	watched := log.seen[msgWatching]
	log.mu.Unlock()
	if watched > total/100 {
		t.Fatalf("%d of %d waits for a slot were watched; want only those that lasted %v", watched, total, watchAfter)
	}
}
