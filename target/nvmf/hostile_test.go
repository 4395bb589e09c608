package nvmf

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
)

// TestHostileHost: malformed commands from a connected host get the NVMe
// status for their fault (and the queue keeps working), or end the queue
// cleanly; never a panic, never a hang, never a touched block. Each case
// then checks the volume holds what honest writes put there.
func TestHostileHost(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 1})
	golden := make([]byte, 64<<10)
	rand.Read(golden)
	if st, err := h.write(0, 0, golden, true); err != nil || st != StatusSuccess {
		t.Fatalf("honest write: %v %v", st, err)
	}
	intact := func(t *testing.T, h *testHost) {
		t.Helper()
		got, st, err := h.read(0, 0, len(golden)/store.BlockSize)
		if err != nil || st != StatusSuccess || !bytes.Equal(got, golden) {
			t.Fatalf("volume changed: %v %v", st, err)
		}
	}
	io := func(op uint8, slba uint64, nlb int) CommandFields { return rw(op, slba, nlb) }
	for _, c := range []struct {
		name string
		f    CommandFields
		o    cmdOpts
		want Status
	}{
		{"sgl-type-segment", io(IORead, 0, 1), cmdOpts{dir: dirToHost, data: make([]byte, 4096),
			mangle: func(c Command) { c[24+15] = SGLTypeSegment << 4 }}, StatusSGLInvalidType | StatusDNR},
		{"sgl-type-bitbucket", io(IOWrite, 0, 1), cmdOpts{dir: dirFromHost, data: make([]byte, 4096),
			mangle: func(c Command) { c[24+15] = SGLTypeBitBucket << 4 }}, StatusSGLInvalidType | StatusDNR},
		{"sgl-keyed-subtype", io(IORead, 0, 1), cmdOpts{dir: dirToHost, data: make([]byte, 4096),
			mangle: func(c Command) { c[24+15] = SGLTypeKeyedData<<4 | 0x3 }}, StatusSGLInvalidSubtype | StatusDNR},
		{"prp-not-sgl", io(IORead, 0, 1), cmdOpts{dir: dirToHost, data: make([]byte, 4096),
			mangle: func(c Command) { c[1] &^= 0xc0 }}, StatusInvalidField | StatusDNR},
		{"read-past-mdts", io(IORead, 0, 512), cmdOpts{dir: dirToHost, data: make([]byte, 1<<20)}, StatusInvalidField | StatusDNR},
		{"keyed-sgl-past-mdts", io(IORead, 0, 1), cmdOpts{dir: dirToHost, data: make([]byte, 4096),
			mangle: func(c Command) { c[8+24], c[9+24], c[10+24] = 0, 0, 0x20 }}, StatusSGLInvalidData | StatusDNR},
		{"sgl-shorter-than-blocks", io(IORead, 0, 2), cmdOpts{dir: dirToHost, data: make([]byte, 4096)}, StatusSGLInvalidData | StatusDNR},
		{"write-past-end", io(IOWrite, 64<<20/4096-1, 2), cmdOpts{dir: dirFromHost, data: make([]byte, 8192)}, StatusLBARange | StatusDNR},
		{"write-wrapping-lba", io(IOWrite, 1<<64-1, 2), cmdOpts{dir: dirFromHost, data: make([]byte, 8192)}, StatusLBARange | StatusDNR},
		{"namespace-2", CommandFields{Opcode: IORead, NSID: 2, CDW10_15: [6]uint32{0, 0, 0}}, cmdOpts{dir: dirToHost, data: make([]byte, 4096)},
			StatusInvalidNS | StatusDNR},
		{"namespace-0-write", CommandFields{Opcode: IOWrite, NSID: 0}, cmdOpts{dir: dirFromHost, data: make([]byte, 4096)},
			StatusInvalidNS | StatusDNR},
		{"in-capsule-read", io(IORead, 0, 1), cmdOpts{dir: dirFromHost, data: make([]byte, 4096), inCapsule: true},
			StatusInvalidField | StatusDNR},
		{"in-capsule-offset-out", io(IOWrite, 0, 1), cmdOpts{dir: dirFromHost, data: make([]byte, 4096), inCapsule: true,
			mangle: func(c Command) { c[24] = 16 }}, StatusSGLInvalidOffset | StatusDNR},
		{"in-capsule-longer-than-capsule", io(IOWrite, 0, 2), cmdOpts{dir: dirFromHost, data: make([]byte, 4096), inCapsule: true,
			lenDelta: 4096}, StatusSGLInvalidOffset | StatusDNR},
		{"unknown-opcode", CommandFields{Opcode: 0x7e, NSID: 1}, cmdOpts{}, StatusInvalidOpcode | StatusDNR},
		{"admin-opcode-on-io", CommandFields{Opcode: AdminIdentify, NSID: 1}, cmdOpts{dir: dirToHost, data: make([]byte, 4096)},
			StatusInvalidOpcode | StatusDNR},
		{"second-connect", CommandFields{Opcode: OpcodeFabrics, NSID: FabricsConnect, CDW10_15: [6]uint32{1 << 16, 31}},
			cmdOpts{dir: dirFromHost, data: make([]byte, ConnectDataLen), inCapsule: true}, StatusCmdSeqError | StatusDNR},
		{"property-get-on-io", CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertyGet}, cmdOpts{}, StatusInvalidOpcode | StatusDNR},
		{"auth-send", CommandFields{Opcode: OpcodeFabrics, NSID: FabricsAuthSend}, cmdOpts{}, StatusInvalidOpcode | StatusDNR},
		{"dsm-short-data", CommandFields{Opcode: IODSM, NSID: 1, CDW10_15: [6]uint32{3, 4}}, cmdOpts{dir: dirFromHost,
			data: make([]byte, 32), inCapsule: true}, StatusSGLInvalidData | StatusDNR},
		// NUMD 0xFFFFFFFF is 2^32 dwords (0-based), not 0 bytes.
		{"resv-report-numd-wraps", CommandFields{Opcode: IOResvReport, NSID: 1, CDW10_15: [6]uint32{0xffffffff}}, cmdOpts{},
			StatusInvalidField | StatusDNR},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _, err := h.io[0].do(c.f, c.o)
			if err != nil {
				t.Fatal(err)
			}
			if r.status() != c.want {
				t.Fatalf("status %v (0x%x), want %v", r.status(), uint16(r.status()), c.want)
			}
			intact(t, h)
		})
	}
	if n := e.srv.m.ProtocolErrors.Load(); n != 0 {
		t.Errorf("%d queues ended for protocol errors", n)
	}

	// Admin-queue faults.
	adminCases := []struct {
		name string
		f    CommandFields
		o    cmdOpts
		want Status
	}{
		{"identify-short-sgl", CommandFields{Opcode: AdminIdentify, CDW10_15: [6]uint32{CNSController}},
			cmdOpts{dir: dirToHost, data: make([]byte, 1024)}, StatusSGLInvalidData | StatusDNR},
		{"identify-cns-unknown", CommandFields{Opcode: AdminIdentify, CDW10_15: [6]uint32{0x1f}},
			cmdOpts{dir: dirToHost, data: make([]byte, 4096)}, StatusInvalidField | StatusDNR},
		{"log-unknown", CommandFields{Opcode: AdminGetLogPage, CDW10_15: [6]uint32{0xc0 | 127<<16}},
			cmdOpts{dir: dirToHost, data: make([]byte, 512)}, StatusInvalidLogPage | StatusDNR},
		{"log-offset-past-page", CommandFields{Opcode: AdminGetLogPage, CDW10_15: [6]uint32{LogSMART | 127<<16, 0, 4096}},
			cmdOpts{dir: dirToHost, data: make([]byte, 512)}, StatusInvalidField | StatusDNR},
		{"discovery-log-on-nvm", CommandFields{Opcode: AdminGetLogPage, CDW10_15: [6]uint32{LogDiscovery | 255<<16}},
			cmdOpts{dir: dirToHost, data: make([]byte, 1024)}, StatusInvalidLogPage | StatusDNR},
		{"set-features-save", CommandFields{Opcode: AdminSetFeatures, CDW10_15: [6]uint32{FeatKATO | 1<<31, 5000}},
			cmdOpts{}, StatusFeatNotSaveable | StatusDNR},
		{"property-set-cap", CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertySet, CDW10_15: [6]uint32{1, propCAP}},
			cmdOpts{}, StatusInvalidField | StatusDNR},
		{"property-get-unknown", CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertyGet, CDW10_15: [6]uint32{0, 0x40}},
			cmdOpts{}, StatusInvalidField | StatusDNR},
		{"create-sq", CommandFields{Opcode: AdminCreateSQ}, cmdOpts{}, StatusInvalidOpcode | StatusDNR},
	}
	for _, c := range adminCases {
		t.Run("admin-"+c.name, func(t *testing.T) {
			r, _, err := h.admin.do(c.f, c.o)
			if err != nil {
				t.Fatal(err)
			}
			if r.status() != c.want {
				t.Fatalf("status %v, want %v", r.status(), c.want)
			}
		})
	}

	// A keyed SGL with a wrong key: the RDMA Read (write command) or RDMA
	// Write (read command) is refused by the host's RNIC with a Terminate;
	// the queue ends, the target frees what the command held, the volume is
	// untouched, and the controller's other queue goes on.
	for _, c := range []struct {
		name string
		f    CommandFields
		o    cmdOpts
	}{
		{"write-wrong-key", io(IOWrite, 0, 16), cmdOpts{dir: dirFromHost, data: make([]byte, 64<<10), wrongKey: true, timeout: 3 * time.Second}},
		{"read-wrong-key", io(IORead, 0, 16), cmdOpts{dir: dirToHost, data: make([]byte, 64<<10), wrongKey: true, timeout: 3 * time.Second}},
		{"write-out-of-bounds", io(IOWrite, 0, 16), cmdOpts{dir: dirFromHost, data: make([]byte, 64<<10), addrOff: 4096, timeout: 3 * time.Second}},
		{"read-out-of-bounds", io(IORead, 0, 16), cmdOpts{dir: dirToHost, data: make([]byte, 64<<10), addrOff: 4096, timeout: 3 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 2})
			_, _, err := h.io[0].do(c.f, c.o)
			if !errors.Is(err, errLost) {
				t.Fatalf("got %v, want the queue lost", err)
			}
			if err := h.io[0].waitLost(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			qi := h.io[0].qp.Query()
			if qi.Terminate == nil || !qi.TerminateSent {
				t.Fatalf("the host's RNIC sent no Terminate: %+v", qi.Terminate)
			}
			t.Logf("host Terminate: %v", qi.Terminate.Cause)
			intact(t, &testHost{io: []*hostQueue{h.io[1]}})
		})
	}
}

// TestHostileConnect: Connect-time faults: commands before Connect, a wrong
// qid, a wrong or absent controller ID, a bad SQ size, unknown subsystems,
// and private data the CM refuses.
func TestHostileConnect(t *testing.T) {
	e := newTestEnv(t, envOpts{volumes: map[string]int64{"vol0": 64 << 20, "other": 16 << 20}})
	nqn := e.srv.NQN("vol0")
	hostNQN := "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"

	t.Run("command-before-connect", func(t *testing.T) {
		q, err := dialQueue(t, e.addr, 0, AdminQueueSize, dialOpts{})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []CommandFields{{Opcode: AdminIdentify, CDW10_15: [6]uint32{1}},
			{Opcode: OpcodeFabrics, NSID: FabricsPropertyGet, CDW10_15: [6]uint32{1}}, {Opcode: AdminKeepAlive}} {
			o := cmdOpts{}
			if f.Opcode == AdminIdentify {
				o = cmdOpts{dir: dirToHost, data: make([]byte, 4096)}
			}
			r, _, err := q.do(f, o)
			if err != nil || r.status() != StatusCmdSeqError|StatusDNR {
				t.Fatalf("opcode 0x%x before Connect: %v %v", f.Opcode, r.status(), err)
			}
		}
	})
	t.Run("admin-commands-before-enable", func(t *testing.T) {
		q, _ := dialQueue(t, e.addr, 0, AdminQueueSize, dialOpts{})
		r, err := q.connectCmd(nqn, hostNQN, newHostID(), DynamicCntlID, 31, 0, nil, nil)
		if err != nil || r.status() != StatusSuccess {
			t.Fatalf("Connect: %v %v", r.status(), err)
		}
		r, _, err = q.do(CommandFields{Opcode: AdminIdentify, CDW10_15: [6]uint32{1}}, cmdOpts{dir: dirToHost, data: make([]byte, 4096)})
		if err != nil || r.status() != StatusCmdSeqError|StatusDNR {
			t.Fatalf("Identify before CC.EN: %v %v", r.status(), err)
		}
		// An I/O queue before enable.
		io, _ := dialQueue(t, e.addr, 1, 32, dialOpts{})
		r2, err := io.connectCmd(nqn, hostNQN, newHostID(), uint16(r.result()), 31, 0, nil, nil)
		if err == nil && r2.status() == StatusSuccess {
			t.Fatal("I/O queue joined a controller that is not enabled")
		}
	})
	admin := func(sub string, mangleCmd func(Command), mangleData func(ConnectData)) (hostResult, error) {
		q, err := dialQueue(t, e.addr, 0, AdminQueueSize, dialOpts{})
		if err != nil {
			return hostResult{}, err
		}
		return q.connectCmd(sub, hostNQN, newHostID(), DynamicCntlID, 31, 0, mangleCmd, mangleData)
	}
	for _, c := range []struct {
		name       string
		sub        string
		mangleCmd  func(Command)
		mangleData func(ConnectData)
		want       Status
		ipo        uint64
	}{
		{"unknown-subsystem", e.srv.NQN("nope"), nil, nil, StatusConnectInvalidParam | StatusDNR, ipoConnectData | 256},
		{"foreign-nqn", "nqn.2000-01.com.example:vol0", nil, nil, StatusConnectInvalidParam | StatusDNR, ipoConnectData | 256},
		{"static-cntlid", nqn, nil, func(d ConnectData) { d[16], d[17] = 5, 0 }, StatusConnectInvalidParam | StatusDNR, ipoConnectData | 16},
		{"qid-mismatch", nqn, func(c Command) { c[42] = 3 }, nil, StatusConnectInvalidParam | StatusDNR, ipoQID},
		{"sqsize-0", nqn, func(c Command) { c[44], c[45] = 0, 0 }, nil, StatusConnectInvalidParam | StatusDNR, ipoSQSize},
		{"sqsize-above-cm", nqn, func(c Command) { c[44], c[45] = 64, 0 }, nil, StatusConnectInvalidParam | StatusDNR, ipoSQSize},
		{"recfmt-1", nqn, func(c Command) { c[40] = 1 }, nil, StatusConnectFormat | StatusDNR, 0},
		{"bad-hostnqn", nqn, nil, func(d ConnectData) { copy(d[512:], "not-an-nqn\x00") }, StatusConnectInvalidParam | StatusDNR, ipoConnectData | 512},
		{"unterminated-subnqn", nqn, nil, func(d ConnectData) {
			for i := 256; i < 512; i++ {
				d[i] = 'a'
			}
		}, StatusConnectInvalidParam | StatusDNR, ipoConnectData | 256},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := admin(c.sub, c.mangleCmd, c.mangleData)
			if err != nil {
				t.Fatal(err)
			}
			if r.status() != c.want || (c.ipo != 0 && r.result() != c.ipo) {
				t.Fatalf("status %v result 0x%x, want %v 0x%x", r.status(), r.result(), c.want, c.ipo)
			}
		})
	}
	h := connectHost(t, e.addr, nqn, hostOpts{ioQueues: 1, hostNQN: hostNQN})
	ioConnect := func(qid uint16, cntlid uint16, sub, host string) (hostResult, error) {
		q, err := dialQueue(t, e.addr, qid, 32, dialOpts{})
		if err != nil {
			return hostResult{}, err
		}
		return q.connectCmd(sub, host, h.hostID, cntlid, 31, 0, nil, nil)
	}
	for _, c := range []struct {
		name   string
		qid    uint16
		cntlid uint16
		sub    string
		host   string
		ipo    uint64
	}{
		{"wrong-cntlid", 2, h.cntlid + 100, nqn, hostNQN, ipoConnectData | 16},
		{"other-host", 2, h.cntlid, nqn, "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555", ipoConnectData | 16},
		{"other-subsystem", 2, h.cntlid, e.srv.NQN("other"), hostNQN, ipoConnectData | 16},
		{"qid-above-granted", 2, h.cntlid, nqn, hostNQN, ipoQID},
		{"qid-taken", 1, h.cntlid, nqn, hostNQN, ipoQID},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ioConnect(c.qid, c.cntlid, c.sub, c.host)
			if err != nil {
				t.Fatal(err)
			}
			if r.status() != StatusConnectInvalidParam|StatusDNR || r.result() != c.ipo {
				t.Fatalf("status %v result 0x%x, want invalid parameter at 0x%x", r.status(), r.result(), c.ipo)
			}
		})
	}
	t.Run("io-queue-on-discovery", func(t *testing.T) {
		d := connectHost(t, e.addr, DiscoveryNQN, hostOpts{ioQueues: -1})
		q, _ := dialQueue(t, e.addr, 1, 32, dialOpts{})
		r, err := q.connectCmd(DiscoveryNQN, d.hostNQN, d.hostID, d.cntlid, 31, 0, nil, nil)
		if err != nil || r.status() != StatusConnectInvalidParam|StatusDNR {
			t.Fatalf("I/O queue on a discovery controller: %v %v", r.status(), err)
		}
	})

	// The CM refuses malformed private data with the reject status.
	for _, c := range []struct {
		name string
		pd   []byte
		want CMRejectStatus
	}{
		{"short", make([]byte, 16), CMRejectInvalidLen},
		{"recfmt", func() []byte {
			b := make([]byte, 32)
			CMRequest(b).Encode(&CMRequestFields{RecFmt: 1, HRQSize: 32, HSQSize: 31})
			return b
		}(), CMRejectInvalidRecFmt},
		{"admin-too-deep", func() []byte {
			b := make([]byte, 32)
			CMRequest(b).Encode(&CMRequestFields{HRQSize: 64, HSQSize: 63})
			return b
		}(), CMRejectInvalidHSQSize},
		{"io-too-deep", func() []byte {
			b := make([]byte, 32)
			CMRequest(b).Encode(&CMRequestFields{QID: 1, HRQSize: 300, HSQSize: 255})
			return b
		}(), CMRejectInvalidHSQSize},
		{"hrqsize-small", func() []byte {
			b := make([]byte, 32)
			CMRequest(b).Encode(&CMRequestFields{QID: 1, HRQSize: 10, HSQSize: 127})
			return b
		}(), CMRejectInvalidHRQSize},
	} {
		t.Run("cm-"+c.name, func(t *testing.T) {
			_, err := dialQueue(t, e.addr, 0, 32, dialOpts{pd: c.pd})
			var re *rnic.RejectError
			if !errors.As(err, &re) || len(re.PrivateData) != CMRejectLen || CMReject(re.PrivateData).Status() != c.want {
				t.Fatalf("got %v, want a reject with status %v", err, c.want)
			}
		})
	}
	// Protocol violations that end the queue: a capsule shorter than a
	// command, in-capsule data on the admin queue.
	t.Run("short-capsule", func(t *testing.T) {
		q, _ := dialQueue(t, e.addr, 1, 32, dialOpts{})
		q.do(CommandFields{Opcode: IORead}, cmdOpts{extra: -20, timeout: time.Second})
		if err := q.waitLost(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("admin-in-capsule-data", func(t *testing.T) {
		q, _ := dialQueue(t, e.addr, 0, 32, dialOpts{})
		q.do(CommandFields{Opcode: AdminKeepAlive}, cmdOpts{extra: 512, timeout: time.Second})
		if err := q.waitLost(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		qi := q.qp.Query()
		if qi.Terminate == nil || qi.TerminateSent {
			t.Fatalf("the target sent no Terminate: %+v", qi.Terminate)
		}
	})
}

// TestHostileConnectTwice: a host that sends two Connect commands back to
// back on one admin queue (the second arriving while the first still reads
// its data and opens the volume) gets one controller: the second Connect
// is refused with Command Sequence Error, no second controller holds the
// volume, and when the queue goes no controller is left behind.
func TestHostileConnectTwice(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	q, err := dialQueue(t, e.addr, 0, AdminQueueSize, dialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, ConnectDataLen)
	ConnectData(data).Encode(&ConnectDataFields{HostID: newHostID(), CntlID: DynamicCntlID, SubNQN: e.srv.NQN("vol0"),
		HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"})
	f := CommandFields{Opcode: OpcodeFabrics, NSID: FabricsConnect}
	f.CDW10_15[1] = AdminQueueSize - 1
	o := cmdOpts{dir: dirFromHost, data: data}
	out := q.doAll([]CommandFields{f, f}, []cmdOpts{o, o})
	var ok, seq int
	for i, c := range out {
		if c.err != nil {
			t.Fatalf("Connect %d: %v", i, c.err)
		}
		switch c.r.status() {
		case StatusSuccess:
			ok++
		case StatusCmdSeqError | StatusDNR:
			seq++
		default:
			t.Fatalf("Connect %d: %v", i, c.r.status())
		}
	}
	e.srv.mu.Lock()
	n := len(e.srv.ctrls)
	e.srv.mu.Unlock()
	if ok != 1 || seq != 1 || n != 1 {
		t.Fatalf("%d Connects succeeded, %d refused for sequence; %d controllers: want 1, 1 and 1", ok, seq, n)
	}
	q.close()
	waitFor(t, 5*time.Second, "the controller to go", func() bool { return e.srv.m.Controllers.Load() == 0 })
}

// TestSQHeadWrapsAtConnectSize: the submission queue is the SQSIZE+1
// entries of the Connect command, so the SQ head pointer in completions
// (the number of commands taken, modulo that size) stays below it, even
// when the CM request's HSQSIZE offered a deeper queue.
func TestSQHeadWrapsAtConnectSize(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	q, err := dialQueue(t, e.addr, 0, AdminQueueSize, dialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	const sqsize = 7 // 0-based: 8 entries
	r, err := q.connectCmd(e.srv.NQN("vol0"), "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100",
		newHostID(), DynamicCntlID, sqsize, 0, nil, nil)
	if err != nil || r.status() != StatusSuccess {
		t.Fatalf("Connect: %v %v", r.status(), err)
	}
	if got := r.completion().SQHead(); got != 1 {
		t.Fatalf("Connect's completion: SQ head %d, want 1", got)
	}
	for i := 2; i <= 3*(sqsize+1); i++ {
		r, _, err := q.do(CommandFields{Opcode: OpcodeFabrics, NSID: FabricsPropertyGet, CDW10_15: [6]uint32{0, propCSTS}}, cmdOpts{})
		if err != nil || r.status() != StatusSuccess {
			t.Fatalf("Property Get %d: %v %v", i, r.status(), err)
		}
		if got, want := r.completion().SQHead(), uint16(i%(sqsize+1)); got != want {
			t.Fatalf("command %d: SQ head %d, want %d on a queue of %d entries", i, got, want, sqsize+1)
		}
	}
}

// TestNumQueuesFixedOnceIOQueuesExist: Set Features Number of Queues
// after an I/O queue was connected fails with Command Sequence Error
// (NVMe Base 2.0 §5.27.1.5) and leaves the number granted as it was.
func TestNumQueuesFixedOnceIOQueuesExist(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	f := CommandFields{Opcode: AdminSetFeatures}
	f.CDW10_15[0] = FeatNumQueues
	f.CDW10_15[1] = 3 | 3<<16 // four of each
	if r, _, err := h.admin.do(f, cmdOpts{}); err != nil || r.status() != StatusCmdSeqError|StatusDNR {
		t.Fatalf("Number of Queues with an I/O queue connected: %v %v, want command sequence error (DNR)", r.status(), err)
	}
	g := CommandFields{Opcode: AdminGetFeatures}
	g.CDW10_15[0] = FeatNumQueues
	r, _, err := h.admin.do(g, cmdOpts{})
	if err != nil || r.status() != StatusSuccess || r.result() != 0 {
		t.Fatalf("Get Features Number of Queues: %v %#x %v, want success and 0 (one of each, 0-based)", r.status(), r.result(), err)
	}
}

// TestFusedCommandsRefused: this controller offers no fused operation
// (Identify Controller FUSES is 0), so a command whose FUSE field is not
// 00b is refused with Invalid Field in Command and does nothing. A Compare
// and Write pair (Compare with FUSE 01b, Write with FUSE 10b) must not
// leave the Write done on its own: the host meant it to happen only if the
// Compare matched.
func TestFusedCommandsRefused(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	golden := make([]byte, store.BlockSize)
	rand.Read(golden)
	if st, err := h.write(0, 7, golden, true); err != nil || st != StatusSuccess {
		t.Fatalf("honest write: %v %v", st, err)
	}
	const ioCompare = 0x05
	cmp := rw(ioCompare, 7, 1)
	cmp.Flags = 1 // FUSE 01b: first command of a fused operation
	wr := rw(IOWrite, 7, 1)
	wr.Flags = 2 // FUSE 10b: second command
	other := make([]byte, store.BlockSize)
	rand.Read(other)
	out := h.io[0].doAll([]CommandFields{cmp, wr}, []cmdOpts{{dir: dirFromHost, data: other}, {dir: dirFromHost, data: other}})
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("fused command %d: %v", i, o.err)
		}
		if st := o.r.status(); st != StatusInvalidField|StatusDNR {
			t.Errorf("fused command %d (opcode 0x%02x): status %v, want %v", i, []uint8{ioCompare, IOWrite}[i], st,
				StatusInvalidField|StatusDNR)
		}
	}
	got, st, err := h.read(0, 7, 1)
	if err != nil || st != StatusSuccess {
		t.Fatalf("read back: %v %v", st, err)
	}
	if !bytes.Equal(got, golden) {
		t.Fatal("the Write of a refused Compare and Write pair changed the block")
	}
	// On the admin queue too.
	f := CommandFields{Opcode: AdminKeepAlive, Flags: 1}
	if r, _, err := h.admin.do(f, cmdOpts{}); err != nil || r.status() != StatusInvalidField|StatusDNR {
		t.Fatalf("Keep Alive with FUSE 01b: %v %v, want %v", r.status(), err, StatusInvalidField|StatusDNR)
	}
}
