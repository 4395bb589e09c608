package nvmf

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// The tests' NVMe/RDMA host, on this module's engine, and their target: a
// native target and this package's server sharing one RNIC, one store and
// one listener, as rtarget runs them. The host behaves like Linux
// nvme-rdma (keyed SGLs under a fresh key per command, subtype 0xF;
// in-capsule writes on I/O queues; the invalidation checks) unless a test
// asks it to misbehave.

func testLogger() *slog.Logger {
	if os.Getenv("RNIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testEnv is the target side.
type testEnv struct {
	t      testing.TB
	st     store.Store
	dev    *rnic.Device
	tgt    *target.Target
	srv    *Server
	l      *rnic.Listener
	addr   string
	secret []byte
	cfg    Config
}

type envOpts struct {
	thin    bool
	volumes map[string]int64 // name -> size (default vol0: 64 MiB)
	cfg     func(*Config)
	// wrap, if set, wraps the store the target and the server use (after
	// the volumes are created in it).
	wrap func(store.Store) store.Store
}

func newTestEnv(t testing.TB, o envOpts) *testEnv {
	t.Helper()
	if o.volumes == nil {
		o.volumes = map[string]int64{"vol0": 64 << 20}
	}
	var st store.Store
	if o.thin {
		var err error
		if st, err = store.OpenThin(t.TempDir(), store.ThinOptions{Logger: testLogger()}); err != nil {
			t.Fatal(err)
		}
	} else {
		st = store.NewMemory()
	}
	for name, size := range o.volumes {
		if _, err := st.CreateVolume(context.Background(), name, size, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if o.wrap != nil {
		st = o.wrap(st)
	}
	e := &testEnv{t: t, st: st, secret: []byte("test secret")}
	var err error
	if e.dev, err = rnic.Open(rnic.Config{Name: "target", Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	if e.tgt, err = target.New(target.Config{Store: st, Device: e.dev, Secret: target.StaticSecret(e.secret),
		Logger: testLogger()}); err != nil {
		t.Fatal(err)
	}
	e.cfg = Config{Target: e.tgt, Store: st, Device: e.dev, Logger: testLogger()}
	if o.cfg != nil {
		o.cfg(&e.cfg)
	}
	if e.srv, err = New(e.cfg); err != nil {
		t.Fatal(err)
	}
	if e.l, err = e.dev.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	e.addr = e.l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	native := Share(e.l, e.srv)
	go func() {
		defer close(done)
		e.tgt.Serve(ctx, native)
	}()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		if err := e.srv.Shutdown(sctx); err != nil {
			t.Errorf("nvmf shutdown: %v", err)
		}
		e.tgt.Shutdown(sctx)
		cancel()
		e.l.Close()
		<-done
		if n := e.srv.bufsOut.Load(); n != 0 {
			t.Errorf("%d data buffers not given back", n)
		}
		e.dev.Close()
		st.Close()
	})
	return e
}

// hostQueue is one queue of the test host.
type hostQueue struct {
	t    testing.TB
	dev  *rnic.Device
	pd   *rnic.PD
	cq   *rnic.CQ
	qp   *rnic.QP
	qid  uint16
	size int
	info *rnic.ConnInfo

	rxBuf []byte // CQE receive buffers, rxSlot bytes each
	rxMR  *rnic.MR
	txBuf []byte // capsules, capLen bytes each, one per cid
	txMR  *rnic.MR
	data  []byte // one maxData area per cid
	stags []*rnic.MR
	cur   []rnic.STag // the STag each cid's area is registered under now
	keyed []bool      // ... and it is valid

	free    chan uint16
	mu      sync.Mutex
	waiters map[uint16]chan hostResult
	lost    chan struct{}
	lostErr error
	stop    context.CancelFunc
	done    chan struct{}
}

const (
	rxSlot  = 64
	capLen  = CommandLen + 8192
	maxData = 1 << 20
)

// hostResult is what came back for a command.
type hostResult struct {
	cqe         [CompletionLen]byte
	invalidated bool
	inv         rnic.STag
}

func (r hostResult) status() Status         { return Completion(r.cqe[:]).Status() }
func (r hostResult) result() uint64         { return Completion(r.cqe[:]).Result() }
func (r hostResult) completion() Completion { return Completion(r.cqe[:]) }

type dialOpts struct {
	rev     int  // MPA revision (2)
	crc     bool // ask for CRC
	pd      []byte
	hrqsize int // 0: size
	noRecv  bool
	ird     int
}

// dialQueue connects one queue of size entries (qid 0: the admin queue).
func dialQueue(t testing.TB, addr string, qid uint16, size int, o dialOpts) (*hostQueue, error) {
	t.Helper()
	dev, err := rnic.Open(rnic.Config{Name: fmt.Sprintf("host-q%d", qid), Logger: testLogger()})
	if err != nil {
		return nil, err
	}
	h := &hostQueue{t: t, dev: dev, qid: qid, size: size, free: make(chan uint16, size),
		waiters: map[uint16]chan hostResult{}, lost: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(h.close)
	h.pd, _ = dev.AllocPD()
	h.cq, _ = dev.CreateCQ(8*size+16, 0)
	ird := o.ird
	if ird == 0 {
		ird = 128
	}
	if h.qp, err = h.pd.CreateQP(rnic.QPConfig{SendCQ: h.cq, RecvCQ: h.cq, SQDepth: 4 * size, RQDepth: size, MaxSendSGE: 2,
		MaxRecvSGE: 1, IRD: ird, InboundRead: true, InboundWrite: true, Privileged: true}); err != nil {
		return nil, err
	}
	h.rxBuf = make([]byte, size*rxSlot)
	h.rxMR, _ = h.pd.RegisterBytes(h.rxBuf, rnic.LocalWrite)
	h.txBuf = make([]byte, size*capLen)
	h.txMR, _ = h.pd.RegisterBytes(h.txBuf, rnic.LocalRead|rnic.LocalWrite)
	h.data = make([]byte, size*maxData)
	h.stags = make([]*rnic.MR, size)
	h.keyed = make([]bool, size)
	h.cur = make([]rnic.STag, size)
	for i := 0; i < size; i++ {
		if h.stags[i], err = h.pd.AllocMRSTag(1, true); err != nil {
			return nil, err
		}
		h.free <- uint16(i)
		if !o.noRecv {
			h.postRecv(i)
		}
	}
	pd := o.pd
	if pd == nil {
		hrq := o.hrqsize
		if hrq == 0 {
			hrq = size
		}
		pd = make([]byte, CMRequestLen)
		CMRequest(pd).Encode(&CMRequestFields{QID: qid, HRQSize: uint16(hrq), HSQSize: uint16(size - 1)})
	}
	rev := o.rev
	if rev == 0 {
		rev = 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.info, err = dev.Connect(ctx, h.qp, addr, rnic.ConnParams{PrivateData: pd, Rev: rev, NoCRC: !o.crc, IRD: ird})
	if err != nil {
		return nil, err
	}
	pctx, pcancel := context.WithCancel(context.Background())
	h.stop = pcancel
	go h.poll(pctx)
	return h, nil
}

func (h *hostQueue) postRecv(i int) {
	if _, err := h.qp.PostRecv(rnic.RecvWR{ID: uint64(i), SGL: []rnic.SGE{{STag: h.rxMR.STag(), TO: uint64(i * rxSlot),
		Len: rxSlot}}}); err != nil {
		h.t.Logf("host post receive: %v", err)
	}
}

func (h *hostQueue) close() {
	if h.stop != nil {
		h.stop()
		<-h.done
	}
	if h.qp != nil && h.qp.State() == rnic.StateRTS {
		h.qp.Modify(rnic.StateError, rnic.ModifyAttrs{})
	}
	h.dev.Close()
}

// poll hands each completion to its waiter.
func (h *hostQueue) poll(ctx context.Context) {
	defer close(h.done)
	var wcs [32]rnic.WC
	for {
		n, err := h.cq.Wait(ctx, wcs[:])
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rnic.StatusSuccess {
				h.mu.Lock()
				if h.lostErr == nil {
					h.lostErr = wc.Err()
					close(h.lost)
				}
				h.mu.Unlock()
				continue
			}
			if wc.Op != rnic.WRRecv {
				continue
			}
			var r hostResult
			copy(r.cqe[:], h.rxBuf[int(wc.ID)*rxSlot:])
			r.invalidated, r.inv = wc.HasInvalidated, wc.Invalidated
			h.postRecv(int(wc.ID))
			cid := Completion(r.cqe[:]).CID()
			h.mu.Lock()
			w := h.waiters[cid]
			delete(h.waiters, cid)
			h.mu.Unlock()
			if w == nil {
				h.t.Errorf("qid %d: completion for cid %d that nobody waits for: % x", h.qid, cid, r.cqe)
				continue
			}
			w <- r
		}
	}
}

// Data directions of a command.
const (
	dirNone = iota
	dirToHost
	dirFromHost
)

// cmdOpts say how a command's data travels and how to misbehave.
type cmdOpts struct {
	dir       int
	data      []byte // fromHost: what to send; toHost: how much to expect (len)
	inCapsule bool   // send the data in the capsule
	noInv     bool   // keyed subtype 0 (no invalidate) instead of 0xF
	wrongKey  bool   // name a key that is not the registered one
	addrOff   int64  // added to the keyed address
	lenDelta  int    // added to the SGL length
	mangle    func(c Command)
	extra     int    // bytes of garbage after the command
	raw       []byte // the whole capsule, sent as it is but for the CID
	timeout   time.Duration
}

var errLost = errors.New("host queue lost")

// do runs one command and returns its completion and, for data to the
// host, the data.
func (h *hostQueue) do(f CommandFields, o cmdOpts) (hostResult, []byte, error) {
	return h.doAll([]CommandFields{f}, []cmdOpts{o})[0].get()
}

// cmdOutcome is what came back for one command of doAll.
type cmdOutcome struct {
	r    hostResult
	data []byte
	err  error
}

func (c cmdOutcome) get() (hostResult, []byte, error) { return c.r, c.data, c.err }

// doAll sends the capsules of several commands in one PostSend (so they
// reach the target back to back, before anything it answers to the first)
// and returns each one's outcome.
func (h *hostQueue) doAll(fs []CommandFields, os []cmdOpts) []cmdOutcome {
	out := make([]cmdOutcome, len(fs))
	ps := make([]*pendingCmd, len(fs))
	var wrs []rnic.SendWR
	for i := range fs {
		p, err := h.prepare(fs[i], os[i])
		if err != nil {
			out[i].err = err
			continue
		}
		ps[i] = p
		wrs = append(wrs, p.wrs...)
	}
	if len(wrs) > 0 {
		if _, err := h.qp.PostSend(wrs...); err != nil {
			for i, p := range ps {
				if p != nil {
					h.forget(p)
					out[i].err = err
				}
			}
			return out
		}
	}
	for i, p := range ps {
		if p != nil {
			out[i].r, out[i].data, out[i].err = h.await(p)
		}
	}
	return out
}

// pendingCmd is a command prepared (capsule, data registration, waiter)
// and not yet answered.
type pendingCmd struct {
	f    CommandFields
	o    cmdOpts
	cid  uint16
	n    int
	area []byte
	wrs  []rnic.SendWR
	w    chan hostResult
}

// prepare takes a cid, builds the command's capsule and the work requests
// that send it, and registers its waiter.
func (h *hostQueue) prepare(f CommandFields, o cmdOpts) (*pendingCmd, error) {
	var cid uint16
	select {
	case cid = <-h.free:
	case <-h.lost:
		return nil, fmt.Errorf("%w: %v", errLost, h.lostErr)
	}
	f.CID = cid
	f.Flags |= PSDTSGL << 6
	n := len(o.data)
	area := h.data[int(cid)*maxData : int(cid)*maxData+maxData]
	capsule := h.txBuf[int(cid)*capLen : int(cid+1)*capLen]
	clen := CommandLen
	var wrs []rnic.SendWR
	mr := h.stags[cid]
	switch {
	case o.inCapsule:
		f.DPTR = SGLFields{Type: SGLTypeData, Subtype: SGLSubOffset, Len: uint32(n + o.lenDelta)}
		copy(capsule[CommandLen:], o.data)
		clen += n
	case n > 0:
		if h.keyed[cid] {
			wrs = append(wrs, rnic.SendWR{Op: rnic.WRInvalidate, InvalidateSTag: mr.STag(), Unsignaled: true})
		}
		stag := mr.STag().WithKey(mr.STag().Key() + 1)
		fr := &rnic.FastReg{STag: stag, Mem: rnic.Bytes(area[:n]), ZeroBased: true, Access: rnic.LocalRead | rnic.LocalWrite |
			rnic.RemoteRead | rnic.RemoteWrite}
		wrs = append(wrs, rnic.SendWR{Op: rnic.WRFastReg, FastReg: fr, Unsignaled: true})
		h.keyed[cid] = true
		if o.dir == dirFromHost {
			copy(area, o.data)
		} else {
			clear(area[:n])
		}
		key := uint32(stag)
		if o.wrongKey {
			key ^= 0x80
		}
		sub := uint8(SGLSubInvalidate)
		if o.noInv {
			sub = SGLSubAddress
		}
		f.DPTR = SGLFields{Type: SGLTypeKeyedData, Subtype: sub, Addr: uint64(int64(o.addrOff)), Len: uint32(n + o.lenDelta), Key: key}
		h.cur[cid] = stag
	default:
		f.DPTR = SGLFields{Type: SGLTypeKeyedData}
	}
	Command(capsule).Encode(&f)
	if o.mangle != nil {
		o.mangle(Command(capsule))
	}
	clen += o.extra
	if o.raw != nil {
		clen = copy(capsule, o.raw)
		binary.LittleEndian.PutUint16(capsule[2:], cid)
	}
	w := make(chan hostResult, 1)
	h.mu.Lock()
	h.waiters[cid] = w
	h.mu.Unlock()
	wrs = append(wrs, rnic.SendWR{Op: rnic.WRSend, Unsignaled: true, SGL: []rnic.SGE{{STag: h.txMR.STag(),
		TO: uint64(int(cid) * capLen), Len: uint32(clen)}}})
	return &pendingCmd{f: f, o: o, cid: cid, n: n, area: area, wrs: wrs, w: w}, nil
}

// forget drops a prepared command that was not sent.
func (h *hostQueue) forget(p *pendingCmd) {
	h.mu.Lock()
	delete(h.waiters, p.cid)
	h.mu.Unlock()
	h.free <- p.cid
}

// await waits for a sent command's completion and checks its invalidation.
func (h *hostQueue) await(p *pendingCmd) (hostResult, []byte, error) {
	f, o, cid, n := p.f, p.o, p.cid, p.n
	defer func() { h.free <- cid }()
	to := o.timeout
	if to == 0 {
		to = 10 * time.Second
	}
	select {
	case r := <-p.w:
		if r.invalidated {
			if want := h.cur[cid]; r.inv != want || f.DPTR.Subtype != SGLSubInvalidate || n == 0 || o.inCapsule {
				return r, nil, fmt.Errorf("completion invalidated %s; the command's keyed SGL: subtype 0x%x, STag %s, %d bytes",
					r.inv, f.DPTR.Subtype, want, n)
			}
			h.keyed[cid] = false
		} else if f.DPTR.Type == SGLTypeKeyedData && f.DPTR.Subtype == SGLSubInvalidate && f.DPTR.Len > 0 &&
			r.status() == StatusSuccess && o.mangle == nil && o.raw == nil {
			return r, nil, fmt.Errorf("a successful command with keyed SGL subtype 0xF came back without Send with Invalidate")
		}
		var out []byte
		if o.dir == dirToHost {
			out = append([]byte(nil), p.area[:n]...)
		}
		return r, out, nil
	case <-h.lost:
		h.mu.Lock()
		delete(h.waiters, cid)
		h.mu.Unlock()
		return hostResult{}, nil, fmt.Errorf("%w: %v", errLost, h.lostErr)
	case <-time.After(to):
		h.mu.Lock()
		delete(h.waiters, cid)
		h.mu.Unlock()
		return hostResult{}, nil, fmt.Errorf("cid %d: no completion in %v", cid, to)
	}
}

// waitLost waits until the queue's connection is gone.
func (h *hostQueue) waitLost(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := h.qp.WaitState(ctx, rnic.StateError, rnic.StateIdle); err != nil {
		return fmt.Errorf("queue %d still connected after %v (%s)", h.qid, d, h.qp.State())
	}
	return nil
}

// connectCmd sends Connect on the queue and returns its completion;
// mangleCmd and mangleData, if set, spoil the command and its data.
func (h *hostQueue) connectCmd(sub, host string, hostID [16]byte, cntlid uint16, sqsize uint16, kato uint32,
	mangleCmd func(Command), mangleData func(ConnectData)) (hostResult, error) {
	data := make([]byte, ConnectDataLen)
	ConnectData(data).Encode(&ConnectDataFields{HostID: hostID, CntlID: cntlid, SubNQN: sub, HostNQN: host})
	if mangleData != nil {
		mangleData(ConnectData(data))
	}
	f := CommandFields{Opcode: OpcodeFabrics, NSID: FabricsConnect}
	f.CDW10_15[0] = uint32(h.qid) << 16 // recfmt 0, qid
	f.CDW10_15[1] = uint32(sqsize)
	f.CDW10_15[2] = kato
	r, _, err := h.do(f, cmdOpts{dir: dirFromHost, data: data, inCapsule: h.qid != 0, mangle: mangleCmd})
	return r, err
}

// propGet reads a property.
func (h *hostQueue) propGet(off uint32, size8 bool) (uint64, Status, error) {
	f := CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertyGet}
	if size8 {
		f.CDW10_15[0] = 1
	}
	f.CDW10_15[1] = off
	r, _, err := h.do(f, cmdOpts{})
	return r.result(), r.status(), err
}

// propSet writes a 4-byte property.
func (h *hostQueue) propSet(off, v uint32) (Status, error) {
	f := CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertySet}
	f.CDW10_15[1] = off
	f.CDW10_15[2] = v
	r, _, err := h.do(f, cmdOpts{})
	return r.status(), err
}

// testHost is a host with an admin queue and I/O queues on one controller.
type testHost struct {
	t       testing.TB
	addr    string
	nqn     string
	hostNQN string
	hostID  [16]byte
	cntlid  uint16
	admin   *hostQueue
	io      []*hostQueue
}

type hostOpts struct {
	ioQueues int // 1
	qsize    int // 32
	kato     uint32
	dial     dialOpts
	hostNQN  string
}

func newHostID() (id [16]byte) { rand.Read(id[:]); return }

// connectHost does what `nvme connect` does: admin queue, Connect,
// enable, Identify Controller, Set Features Number of Queues, then the I/O
// queues.
func connectHost(t testing.TB, addr, subNQN string, o hostOpts) *testHost {
	t.Helper()
	h, err := tryConnectHost(t, addr, subNQN, o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func tryConnectHost(t testing.TB, addr, subNQN string, o hostOpts) (*testHost, error) {
	if o.ioQueues == 0 {
		o.ioQueues = 1
	}
	if o.qsize == 0 {
		o.qsize = 32
	}
	if o.kato == 0 {
		o.kato = 10000
	}
	if o.hostNQN == "" {
		o.hostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"
	}
	h := &testHost{t: t, addr: addr, nqn: subNQN, hostNQN: o.hostNQN, hostID: newHostID()}
	var err error
	if h.admin, err = dialQueue(t, addr, 0, AdminQueueSize, o.dial); err != nil {
		return nil, fmt.Errorf("admin queue: %w", err)
	}
	r, err := h.admin.connectCmd(subNQN, h.hostNQN, h.hostID, DynamicCntlID, AdminQueueSize-1, o.kato, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("admin Connect: %w", err)
	}
	if r.status() != StatusSuccess {
		return nil, &StatusError{Status: r.status(), Result: r.result(), Reason: "admin Connect"}
	}
	h.cntlid = uint16(r.result())
	if r.result()>>16&3 != 0 {
		return nil, fmt.Errorf("Connect result 0x%x asks for authentication", r.result())
	}
	if err := h.enable(); err != nil {
		return nil, err
	}
	if o.ioQueues > 0 && subNQN != DiscoveryNQN {
		f := CommandFields{Opcode: AdminSetFeatures}
		f.CDW10_15[0] = FeatNumQueues
		f.CDW10_15[1] = uint32(o.ioQueues-1) | uint32(o.ioQueues-1)<<16
		if r, _, err := h.admin.do(f, cmdOpts{}); err != nil || r.status() != StatusSuccess {
			return nil, fmt.Errorf("Set Features Number of Queues: %v %v", r.status(), err)
		}
		for i := 1; i <= o.ioQueues; i++ {
			q, err := dialQueue(t, addr, uint16(i), o.qsize, o.dial)
			if err != nil {
				return nil, fmt.Errorf("I/O queue %d: %w", i, err)
			}
			r, err := q.connectCmd(subNQN, h.hostNQN, h.hostID, h.cntlid, uint16(o.qsize-1), 0, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("I/O queue %d Connect: %w", i, err)
			}
			if r.status() != StatusSuccess {
				return nil, &StatusError{Status: r.status(), Result: r.result(), Reason: fmt.Sprintf("I/O queue %d Connect", i)}
			}
			h.io = append(h.io, q)
		}
	}
	return h, nil
}

// enable writes CC.EN with the I/O queue entry sizes and waits for RDY.
func (h *testHost) enable() error {
	if st, err := h.admin.propSet(propCC, 6<<16|4<<20|ccEnable); err != nil || st != StatusSuccess {
		return fmt.Errorf("Property Set CC: %v %v", st, err)
	}
	v, st, err := h.admin.propGet(propCSTS, false)
	if err != nil || st != StatusSuccess || v&cstsReady == 0 {
		return fmt.Errorf("CSTS 0x%x after enable: %v %v", v, st, err)
	}
	return nil
}

// identify returns Identify data.
func (h *testHost) identify(cns uint8, nsid uint32) ([]byte, Status, error) {
	f := CommandFields{Opcode: AdminIdentify, NSID: nsid}
	f.CDW10_15[0] = uint32(cns)
	r, b, err := h.admin.do(f, cmdOpts{dir: dirToHost, data: make([]byte, IdentifyLen)})
	return b, r.status(), err
}

// getLog reads n bytes of a log page at offset off.
func (h *testHost) getLog(lid uint8, n int, off uint64) ([]byte, Status, error) {
	numd := uint32(n/4 - 1)
	f := CommandFields{Opcode: AdminGetLogPage}
	f.CDW10_15[0] = uint32(lid) | numd<<16
	f.CDW10_15[1] = numd >> 16
	f.CDW10_15[2] = uint32(off)
	f.CDW10_15[3] = uint32(off >> 32)
	r, b, err := h.admin.do(f, cmdOpts{dir: dirToHost, data: make([]byte, n)})
	return b, r.status(), err
}

// rw builds a read or write of nlb blocks at slba.
func rw(op uint8, slba uint64, nlb int) CommandFields {
	f := CommandFields{Opcode: op, NSID: 1}
	f.CDW10_15[0], f.CDW10_15[1] = uint32(slba), uint32(slba>>32)
	f.CDW10_15[2] = uint32(nlb - 1)
	return f
}

// read reads nlb blocks at slba on I/O queue q.
func (h *testHost) read(q int, slba uint64, nlb int) ([]byte, Status, error) {
	r, b, err := h.io[q].do(rw(IORead, slba, nlb), cmdOpts{dir: dirToHost, data: make([]byte, nlb*store.BlockSize)})
	return b, r.status(), err
}

// write writes data at slba on I/O queue q, in the capsule when it fits
// (as Linux does up to the in-capsule size) unless keyed is set.
func (h *testHost) write(q int, slba uint64, data []byte, keyed bool) (Status, error) {
	o := cmdOpts{dir: dirFromHost, data: data, inCapsule: !keyed && len(data) <= DefaultInCapsule}
	r, _, err := h.io[q].do(rw(IOWrite, slba, len(data)/store.BlockSize), o)
	return r.status(), err
}

// disconnect shuts the controller down as `nvme disconnect` does.
func (h *testHost) disconnect() error {
	for _, q := range h.io {
		q.close()
	}
	if st, err := h.admin.propSet(propCC, 6<<16|4<<20|ccEnable|1<<14); err != nil || st != StatusSuccess {
		return fmt.Errorf("shutdown notification: %v %v", st, err)
	}
	v, st, err := h.admin.propGet(propCSTS, false)
	if err != nil || st != StatusSuccess || v&cstsShstMsk != cstsShstCmp {
		return fmt.Errorf("CSTS 0x%x after shutdown: %v %v", v, st, err)
	}
	h.admin.close()
	return nil
}

// waitFor polls cond for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
