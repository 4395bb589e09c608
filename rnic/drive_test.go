package rnic

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// Tests of the consumer-driven receive (drive.go): CQ.Wait runs the
// receive of the stream it waits for.

// drivePair is a pair whose receive at a, once lent to a's waiters, stays
// lent for lend (0: the default). b keeps the default: with a longer one,
// Read Requests to b would wait that long whenever b's own waiters (b.wait)
// had paused with its receive.
func drivePair(t *testing.T, lend time.Duration, o pairOpts) (*side, *side) {
	t.Helper()
	return newPair(t, o, func(a, _ *side) { a.dev.cfg.lendFor = lend })
}

// readLoop makes n 4 KiB RDMA Reads from b one at a time, waiting on
// a.scq, and checks the data.
func readLoop(t *testing.T, a, b *side, n int) {
	t.Helper()
	src, sb := b.reg(4096, LocalRead|RemoteRead)
	sink, db := a.reg(4096, LocalWrite|RemoteWrite)
	for i := 0; i < n; i++ {
		for j := range sb {
			sb[j] = byte(i + j)
		}
		a.post(SendWR{ID: uint64(i), Op: WRRead, Local: SGE{STag: sink.STag(), Len: 4096}, Remote: RemoteAddr{STag: src.STag()}})
		if wc := a.waitOK(a.scq, WRRead); wc.ID != uint64(i) {
			t.Fatalf("read %d completed as %d", i, wc.ID)
		}
		if !bytes.Equal(db, sb) {
			t.Fatalf("read %d: data differs", i)
		}
	}
}

// lendToWaiters makes Read round trips until a's receive is lent to its
// waiters: a Wait asks for the receive only when its completion is not
// already there, which a slow scheduler (the race detector) can make rare.
func lendToWaiters(t *testing.T, a, b *side) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); a.stream().drive.baton.Load() != batonLent; {
		if time.Now().After(deadline) {
			t.Fatal("the receive was never lent to a waiter")
		}
		readLoop(t, a, b, 1)
	}
}

// waitBaton waits until s's receive baton is want.
func waitBaton(t *testing.T, s *side, want int32) {
	t.Helper()
	c := s.stream()
	for deadline := time.Now().Add(10 * time.Second); c.drive.baton.Load() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: baton %d, want %d", s.dev.Name(), c.drive.baton.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWaitDrivesReceive: a consumer that waits for one Read after another
// takes the receive over after its first Wait, and keeps it between
// Waits; every Read places the right bytes.
func TestWaitDrivesReceive(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	if a.scq.drv.Load() != a.stream() {
		t.Fatal("a CQ one stream uses alone is not drivable")
	}
	lendToWaiters(t, a, b)
	readLoop(t, a, b, 200)
	if got := a.stream().drive.baton.Load(); got != batonLent {
		t.Fatalf("between Waits the baton is %d, want lent (%d)", got, batonLent)
	}
}

// TestWaitDriveNotShared: a CQ two QPs use is never driven.
func TestWaitDriveNotShared(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	if _, err := a.pd.CreateQP(QPConfig{SendCQ: a.scq, RecvCQ: a.rcq}); err != nil {
		t.Fatal(err)
	}
	if a.scq.drv.Load() != nil || a.rcq.drv.Load() != nil {
		t.Fatal("a CQ another QP uses is still drivable")
	}
	readLoop(t, a, b, 20)
	if got := a.stream().drive.baton.Load(); got != batonRecv {
		t.Fatalf("baton %d, want the receive goroutine's", got)
	}
}

// TestWaitDriveKickedByTransmitter: completions the transmit goroutine
// queues (a Send too large to leave inline) reach a waiter that drives the
// receive and finds nothing on its socket: it is kicked out of the poller.
func TestWaitDriveKickedByTransmitter(t *testing.T) {
	const size = 256 << 10 // past inlineMsg: the transmit goroutine sends it
	a, b := drivePair(t, time.Hour, pairOpts{})
	rmr, _ := b.reg(size, LocalWrite)
	smr, _ := a.reg(size, LocalRead)
	lendToWaiters(t, a, b)
	kicks := a.stream().drive.kicks.Load()
	for i := 0; i < 20; i++ {
		b.postRecv(uint64(i), rmr, size)
		a.post(SendWR{ID: uint64(i), Op: WRSend, SGL: []SGE{{STag: smr.STag(), Len: size}}})
		a.waitOK(a.scq, WRSend)
		b.waitOK(b.rcq, WRRecv)
	}
	if a.stream().drive.kicks.Load() == kicks {
		t.Fatal("no kick: the test did not reach a waiter in the poller")
	}
	readLoop(t, a, b, 3) // the kicks left the stream as it was
}

// TestWaitDriveCtx: a driving waiter's ctx ends its wait, and the stream
// reads on as before.
func TestWaitDriveCtx(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	lendToWaiters(t, a, b)
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		start := time.Now()
		var wc [1]WC
		n, err := a.scq.Wait(ctx, wc[:])
		cancel()
		if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with nothing to come: %d, %v", n, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the ctx ended the wait after %v", d)
		}
	}
	readLoop(t, a, b, 3)
	if q := a.qp.Query(); q.State != StateRTS {
		t.Fatalf("QP %s after the cancelled waits", q.State)
	}
}

// TestWaitDriveCtxMidFPDU: a ctx that ends while the driving waiter is in
// the middle of an FPDU ends nothing before the FPDU is whole: the stream
// is intact and the Read completes.
func TestWaitDriveCtxMidFPDU(t *testing.T) {
	ctxEndsWhileHeld(t, 64<<10, 1000) // part of the first Read Response FPDU
}

// TestWaitDriveCtxMidHeader: the same when the waiter has read only the
// first byte of an FPDU's two-byte MPA header (a TCP segment boundary
// there): the Reader is not between FPDUs, so the waiter must not pause.
func TestWaitDriveCtxMidHeader(t *testing.T) {
	ctxEndsWhileHeld(t, 4096, 1)
}

// ctxEndsWhileHeld ends a driving waiter's ctx once the proxy has let the
// first hold bytes of the answer to a size-byte Read through, then lets
// the rest through: the Read completes with its data, the stream intact.
func ctxEndsWhileHeld(t *testing.T, size int, hold int64) {
	var p *proxy
	a, b := drivePair(t, time.Hour, pairOpts{proxy: &p})
	lendToWaiters(t, a, b)
	src, sb := b.reg(size, LocalRead|RemoteRead)
	for i := range sb {
		sb[i] = byte(i * 7)
	}
	sink, db := a.reg(size, LocalWrite|RemoteWrite)
	held := p.hold(hold)
	a.post(SendWR{ID: 9, Op: WRRead, Local: SGE{STag: sink.STag(), Len: uint32(size)}, Remote: RemoteAddr{STag: src.STag()}})
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	var wc [1]WC
	go func() {
		_, err := a.scq.Wait(ctx, wc[:])
		res <- err
	}()
	time.Sleep(20 * time.Millisecond) // the waiter reads what is let through and waits for more
	cancel()
	time.Sleep(20 * time.Millisecond)
	p.unhold()
	if err := <-res; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v", err)
	}
	if wc[0].Op != WRRead {
		wc[0] = a.wait(a.scq)
	}
	if wc[0].Status != StatusSuccess || wc[0].ID != 9 || !bytes.Equal(db, sb) {
		t.Fatalf("the Read: %+v, data equal %v; QP %s", wc[0], bytes.Equal(db, sb), a.qp.Query().State)
	}
	readLoop(t, a, b, 3)
}

// TestWaitDrivePeerReset: the stream ends while a waiter drives its
// receive (the peer resets it): the receive goroutine ends the stream as
// always, and the waiter gets its WR flushed.
func TestWaitDrivePeerReset(t *testing.T) {
	var p *proxy
	a, b := drivePair(t, time.Hour, pairOpts{proxy: &p})
	lendToWaiters(t, a, b)
	mr, _ := a.reg(64, LocalWrite)
	a.postRecv(1, mr, 64)
	c := a.stream()
	go func() {
		time.Sleep(20 * time.Millisecond)
		p.reset()
	}()
	wc := a.wait(a.rcq)
	if wc.Status != StatusFlushed || wc.ID != 1 {
		t.Fatalf("the receive: %+v, want flushed", wc)
	}
	a.settle(c)
	if q := a.qp.Query(); q.State != StateError {
		t.Fatalf("QP %s, want Error", q.State)
	}
	if ev := a.waitEvent(EventLLPConnectionReset); ev.QP != a.qp {
		t.Fatalf("event %+v", ev)
	}
}

// TestWaitDriveLocalError: moving the QP to Error while a waiter drives
// its receive flushes the waiter's WR and ends the stream.
func TestWaitDriveLocalError(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	lendToWaiters(t, a, b)
	mr, _ := a.reg(64, LocalWrite)
	a.postRecv(1, mr, 64)
	c := a.stream()
	res := make(chan WC, 1)
	go func() { res <- a.wait(a.rcq) }()
	time.Sleep(20 * time.Millisecond)
	if err := a.qp.Modify(StateError, ModifyAttrs{}); err != nil {
		t.Fatal(err)
	}
	select {
	case wc := <-res:
		if wc.Status != StatusFlushed {
			t.Fatalf("the receive: %+v, want flushed", wc)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not released")
	}
	a.settle(c)
}

// TestWaitDriveDirectHandler: setting a direct handler gives a lent
// receive back to the receive goroutine at once, which then runs it.
func TestWaitDriveDirectHandler(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	lendToWaiters(t, a, b)
	got := make(chan WC, 4)
	a.rcq.SetDirectHandler(func() bool {
		var wc [1]WC
		for a.rcq.Poll(wc[:]) > 0 {
			got <- wc[0]
		}
		return true
	})
	waitBaton(t, a, batonRecv)
	sendOne(a, b)
	select {
	case wc := <-got:
		if wc.ID != 7 || wc.Status != StatusSuccess {
			t.Fatalf("direct handler got %+v", wc)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the direct handler never ran")
	}
}

// TestWaitDriveLendExpires: once its waiters stop waiting, the receive
// goes back to the receive goroutine, which takes what arrives.
func TestWaitDriveLendExpires(t *testing.T) {
	a, b := drivePair(t, 0, pairOpts{})
	rmr, _ := a.reg(64, LocalWrite)
	a.postRecv(7, rmr, 64)
	readLoop(t, a, b, 50)
	if err := a.rcq.RequestNotify(false); err != nil {
		t.Fatal(err)
	}
	smr, _ := b.reg(64, LocalRead)
	b.post(SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: smr.STag(), Len: 64}}})
	select {
	case <-a.rcq.C():
	case <-time.After(10 * time.Second):
		t.Fatal("the Send was never received")
	}
	if wcs := drainCQ(a.rcq); len(wcs) != 1 || wcs[0].ID != 7 || wcs[0].Status != StatusSuccess {
		t.Fatalf("receive completions %+v", wcs)
	}
	waitBaton(t, a, batonRecv)
}

// TestWaitDriveConcurrentWaiters: two goroutines waiting on one CQ share
// its completions, whoever drives the receive.
func TestWaitDriveConcurrentWaiters(t *testing.T) {
	const n = 400
	a, b := drivePair(t, 0, pairOpts{qp: QPConfig{SQDepth: 64}})
	src, _ := b.reg(4096, LocalRead|RemoteRead)
	sink, _ := a.reg(4096, LocalWrite|RemoteWrite)
	var mu sync.Mutex
	seen := make(map[uint64]bool)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sem := make(chan struct{}, 8) // reads in flight
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var wc [1]WC
			for {
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					return
				}
				k, err := a.scq.Wait(ctx, wc[:])
				if err != nil {
					mu.Lock()
					if len(seen) < n {
						t.Errorf("Wait: %v (%d of %d seen)", err, len(seen), n)
					}
					mu.Unlock()
					return
				}
				if k == 1 {
					if wc[0].Status != StatusSuccess {
						t.Errorf("read %+v", wc[0])
					}
					mu.Lock()
					if seen[wc[0].ID] {
						t.Errorf("read %d completed twice", wc[0].ID)
					}
					seen[wc[0].ID] = true
					all := len(seen) == n
					mu.Unlock()
					<-sem
					if all {
						cancel() // the other waiter is done too
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		a.post(SendWR{ID: uint64(i), Op: WRRead, Local: SGE{STag: sink.STag(), Len: 4096}, Remote: RemoteAddr{STag: src.STag()}})
	}
	wg.Wait()
}

// TestNoWaitDrive: with Config.NoWaitDrive, Wait leaves the receive to
// the receive goroutine.
func TestNoWaitDrive(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{cfg: Config{NoWaitDrive: true}})
	if a.scq.drv.Load() != nil {
		t.Fatal("a CQ of a NoWaitDrive device is drivable")
	}
	readLoop(t, a, b, 20)
	if got := a.stream().drive.baton.Load(); got != batonRecv {
		t.Fatalf("baton %d, want the receive goroutine's", got)
	}
}

// TestDrainAfterKick: a kick left pending when the stream ends (meant for
// a waiter that no longer drives) does not cut the end-of-stream drain
// short: drain still waits for the peer's close.
func TestDrainAfterKick(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	c := &conn{nc: p1, dev: &Device{cfg: Config{CloseTimeout: 10 * time.Second}}}
	c.kickWaiter()
	go func() {
		p2.Write([]byte("the peer's last bytes"))
		time.Sleep(20 * time.Millisecond)
		p2.Close()
	}()
	if !c.drain() {
		t.Fatal("drain gave up before the peer closed")
	}
}

// TestWaitDriveWantMidHeader: the receive goroutine holds the receive and
// has read the first byte of an FPDU's MPA header when it finds that a
// waiter asked for the receive and the socket is empty. It must not lend
// the receive there: the stream must stay intact and the Read complete.
func TestWaitDriveWantMidHeader(t *testing.T) {
	var p *proxy
	a, b := drivePair(t, time.Millisecond, pairOpts{proxy: &p})
	lendToWaiters(t, a, b)
	waitBaton(t, a, batonRecv) // the lend expired
	time.Sleep(20 * time.Millisecond)
	src, sb := b.reg(4096, LocalRead|RemoteRead)
	for i := range sb {
		sb[i] = byte(i * 7)
	}
	sink, db := a.reg(4096, LocalWrite|RemoteWrite)
	held := p.hold(1)
	res := make(chan WC, 1)
	go func() { res <- a.wait(a.scq) }() // asks for the receive (want)
	time.Sleep(20 * time.Millisecond)
	a.post(SendWR{ID: 9, Op: WRRead, Local: SGE{STag: sink.STag(), Len: 4096}, Remote: RemoteAddr{STag: src.STag()}})
	<-held
	time.Sleep(20 * time.Millisecond) // the receive goroutine reads the byte
	p.unhold()
	var wc WC
	select {
	case wc = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
	}
	if wc.Status != StatusSuccess || wc.ID != 9 || !bytes.Equal(db, sb) {
		t.Fatalf("the Read: %+v, data equal %v; QP %s", wc, bytes.Equal(db, sb), a.qp.Query().State)
	}
	readLoop(t, a, b, 3)
}

// TestWaitDriveDirectHandlerWhileDriving: a direct handler set on the
// QP's other CQ while a waiter drives the receive (the waiter has nothing
// to come on its own CQ yet) takes the receive back for the receive
// goroutine, which runs the handler: it must not run inside the waiter's
// CQ.Wait, and the waiter must not keep the receive until its ctx ends.
func TestWaitDriveDirectHandlerWhileDriving(t *testing.T) {
	a, b := drivePair(t, time.Hour, pairOpts{})
	lendToWaiters(t, a, b)
	c := a.stream()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := make(chan error, 1)
	go func() {
		var wc [1]WC
		_, err := a.scq.Wait(ctx, wc[:]) // nothing comes on scq: it drives
		res <- err
	}()
	waitBaton(t, a, batonWaiter)
	type call struct{ baton int32 }
	got := make(chan call, 4)
	a.rcq.SetDirectHandler(func() bool {
		var wc [1]WC
		for a.rcq.Poll(wc[:]) > 0 {
			got <- call{c.drive.baton.Load()}
		}
		return true
	})
	sendOne(a, b)
	select {
	case cl := <-got:
		if cl.baton != batonRecv {
			t.Errorf("the direct handler ran with the receive baton %d (a waiter's: %d), not on the receive goroutine", cl.baton, batonWaiter)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the direct handler never ran")
	}
	deadline := time.Now().Add(2 * time.Second)
	for c.drive.baton.Load() != batonRecv && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if bt := c.drive.baton.Load(); bt != batonRecv {
		t.Errorf("2 s after SetDirectHandler the baton is %d, want the receive goroutine's (%d)", bt, batonRecv)
	}
	cancel()
	<-res
}

// TestDrainLateKick: a kick can land after drain has begun: pushHeld
// loads cq.driving, and ctxEnded the baton, before the waiter clears them
// and gives the ended stream back, and kicks after. drain must still wait
// for the peer's close rather than take the kick's deadline for the end
// of CloseTimeout.
func TestDrainLateKick(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	c := &conn{nc: p1, dev: &Device{cfg: Config{CloseTimeout: 10 * time.Second}}}
	go func() {
		p2.Write([]byte("the peer's last bytes"))
		c.kickWaiter() // late: drain is reading
		time.Sleep(20 * time.Millisecond)
		p2.Write([]byte("and its Terminate"))
		p2.Close()
	}()
	if !c.drain() {
		t.Fatal("drain gave up before the peer closed")
	}
}

// sendOne has b send 64 bytes to a receive buffer that a posts (ID 7).
func sendOne(a, b *side) {
	rmr, _ := a.reg(64, LocalWrite)
	a.postRecv(7, rmr, 64)
	smr, _ := b.reg(64, LocalRead)
	b.post(SendWR{ID: 1, Op: WRSend, SGL: []SGE{{STag: smr.STag(), Len: 64}}})
}
