package nvmf

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// TestConnectIdentifyIO runs what `nvme connect` and a first I/O do, on
// both MPA revisions, with and without CRC: Connect, enable, Identify
// Controller with the fields Linux enforces, the namespace scan, then
// writes (in-capsule and keyed) read back.
func TestConnectIdentifyIO(t *testing.T) {
	for _, v := range []struct {
		name string
		d    dialOpts
	}{{"rev2", dialOpts{}}, {"rev1-crc", dialOpts{rev: 1, crc: true}}, {"rev2-crc", dialOpts{crc: true}}} {
		t.Run(v.name, func(t *testing.T) {
			e := newTestEnv(t, envOpts{})
			h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 2, dial: v.d})
			if got := h.admin.info.Rev; got != max(v.d.rev, 1) && !(v.d.rev == 0 && got == 2) {
				t.Fatalf("MPA revision %d", got)
			}
			if h.admin.info.CRC != v.d.crc {
				t.Fatalf("CRC %v, host asked %v", h.admin.info.CRC, v.d.crc)
			}
			if v.d.rev != 1 && h.admin.info.PeerORD == 0 {
				t.Fatalf("the target's ORD is 0: it could never read host data")
			}
			b, st, err := h.identify(CNSController, 0)
			if err != nil || st != StatusSuccess {
				t.Fatalf("Identify Controller: %v %v", st, err)
			}
			id := IdentifyController(b)
			checks := []struct {
				what      string
				got, want uint64
			}{
				{"cntlid", uint64(id.CntlID()), uint64(h.cntlid)},
				{"ver", uint64(id.Ver()), nvmeVersion},
				{"cntrltype", uint64(id.CntrlType()), CntrlTypeIO},
				{"sqes", uint64(id.SQES()), 0x66},
				{"cqes", uint64(id.CQES()), 0x44},
				{"icdoff", uint64(id.ICDOFF()), 0},
				{"ioccsz", uint64(id.IOCCSZ()), 260},
				{"iorcsz", uint64(id.IORCSZ()), 1},
				{"msdbd", uint64(id.MSDBD()), 1},
				{"nn", uint64(id.NN()), 1},
				{"vwc", uint64(id.VWC()), 1},
				{"mdts", uint64(id.MDTS()), 8},
				{"sgls", uint64(id.SGLS()), 0x100005},
				{"oaes", uint64(id.OAES()), 0},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("Identify Controller %s = 0x%x, want 0x%x", c.what, c.got, c.want)
				}
			}
			if id.KAS() == 0 || id.MaxCmd() == 0 || id.SubNQN() != e.srv.NQN("vol0") {
				t.Errorf("kas %d maxcmd %d subnqn %q", id.KAS(), id.MaxCmd(), id.SubNQN())
			}
			// The namespace scan of Linux 6.1: CNS 6, 2, 3, 0.
			if _, st, err := h.identify(CNSCSController, 0); err != nil || st != StatusSuccess {
				t.Fatalf("CNS 6: %v %v", st, err)
			}
			b, st, err = h.identify(CNSActiveNSList, 0)
			if err != nil || st != StatusSuccess || !bytes.Equal(b[:8], []byte{1, 0, 0, 0, 0, 0, 0, 0}) {
				t.Fatalf("active namespace list: %v %v % x", st, err, b[:8])
			}
			b, st, err = h.identify(CNSNSDescriptors, 1)
			if err != nil || st != StatusSuccess || b[0] != NIDTNGUID || b[20] != NIDTUUID || b[40] != NIDTCSI {
				t.Fatalf("namespace descriptors: %v %v % x", st, err, b[:44])
			}
			nguid := [16]byte(b[4:20])
			b, st, err = h.identify(CNSNamespace, 1)
			ns := IdentifyNamespace(b)
			if err != nil || st != StatusSuccess || ns.NSZE() != 64<<20/store.BlockSize || ns.NCAP() != ns.NSZE() ||
				ns.LBADS() != 12 || ns.NLBAF() != 0 || ns.FLBAS() != 0 || ns.NGUID() != nguid {
				t.Fatalf("Identify Namespace: %v %v nsze %d lbads %d", st, err, ns.NSZE(), ns.LBADS())
			}
			if _, st, _ := h.identify(CNSNamespace, 2); st != StatusInvalidNS|StatusDNR {
				t.Errorf("Identify of namespace 2: %v", st)
			}
			// Writes: 4 KiB in the capsule, 8 KiB and 128 KiB keyed (RDMA
			// Read), on both queues; reads (RDMA Write) compare.
			for q := range h.io {
				for i, size := range []int{4096, 8192, 128 << 10, 1 << 20} {
					data := make([]byte, size)
					rand.Read(data)
					lba := uint64(q*4096 + i*512)
					if st, err := h.write(q, lba, data, size > 4096); err != nil || st != StatusSuccess {
						t.Fatalf("queue %d write of %d: %v %v", q, size, st, err)
					}
					got, st, err := h.read(q, lba, size/store.BlockSize)
					if err != nil || st != StatusSuccess || !bytes.Equal(got, data) {
						t.Fatalf("queue %d read of %d: %v %v equal %v", q, size, st, err, bytes.Equal(got, data))
					}
				}
			}
			if n := e.srv.m.InCapsuleWrites.Load(); n != 2 {
				t.Errorf("%d in-capsule writes, want 2", n)
			}
			if err := h.disconnect(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5e9, "the controller to go", func() bool { return e.srv.m.Controllers.Load() == 0 })
		})
	}
}

// TestConcurrentIO runs many commands at once on each queue, sizes mixed,
// and checks every block against a model.
func TestConcurrentIO(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{ioQueues: 2, qsize: 64})
	const regions = 64
	var wg sync.WaitGroup
	errs := make(chan error, regions)
	for r := 0; r < regions; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := r % 2
			for i := 0; i < 8; i++ {
				size := []int{4096, 16384, 65536, 4096 * 3}[(r+i)%4]
				data := make([]byte, size)
				rand.Read(data)
				lba := uint64(r * 64)
				if st, err := h.write(q, lba, data, i%2 == 1); err != nil || st != StatusSuccess {
					errs <- fmt.Errorf("write: %v %v", st, err)
					return
				}
				got, st, err := h.read(1-q, lba, size/store.BlockSize)
				if err != nil || st != StatusSuccess || !bytes.Equal(got, data) {
					errs <- fmt.Errorf("read back region %d: %v %v", r, st, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestSharedNamespaceSaysSo: a volume's subsystem takes a controller for
// every admin queue that connects (two paths of one host, or several
// hosts sharing the volume), so Identify Controller says the subsystem
// may have several controllers (CMIC bit 1) and Identify Namespace that
// namespace 1 may be attached to several at once (NMIC bit 0). Linux
// refuses a second controller to a subsystem whose CMIC bit 1 is clear
// ("Subsystem does not support multiple controllers"), and a namespace
// seen through two controllers that is not shared ("Duplicate unshared
// namespace"): with them clear, multipath to one volume cannot work.
func TestSharedNamespaceSaysSo(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	a := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	b := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	for i, h := range []*testHost{a, b} {
		id, st, err := h.identify(CNSController, 0)
		if err != nil || st != StatusSuccess {
			t.Fatalf("controller %d: Identify Controller: %v %v", i, st, err)
		}
		if IdentifyController(id).CMIC()&(1<<1) == 0 {
			t.Errorf("controller %d of a subsystem with 2: CMIC 0x%x, multiple controllers (bit 1) clear", i,
				IdentifyController(id).CMIC())
		}
		ns, st, err := h.identify(CNSNamespace, 1)
		if err != nil || st != StatusSuccess {
			t.Fatalf("controller %d: Identify Namespace: %v %v", i, st, err)
		}
		if IdentifyNamespace(ns).NMIC()&1 == 0 {
			t.Errorf("controller %d: namespace 1, attached to 2 controllers: NMIC 0x%x, shared (bit 0) clear", i,
				IdentifyNamespace(ns).NMIC())
		}
	}
}

// TestTemperatureThresholds: Get/Set Features Temperature Threshold keeps
// the composite temperature's over- and under-temperature thresholds
// apart (THSEL), refuses sensors the controller does not have (TMPSEL 1-8:
// SMART reports none), and the SMART log's critical warning bit 1 says
// when the composite temperature (298 K) is past either.
func TestTemperatureThresholds(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	const under, sensor1 = 1 << 20, 1 << 16
	get := func(cdw11 uint32) (uint64, Status) {
		t.Helper()
		r, _, err := h.admin.do(CommandFields{Opcode: AdminGetFeatures, CDW10_15: [6]uint32{FeatTempThreshold, cdw11}}, cmdOpts{})
		if err != nil {
			t.Fatal(err)
		}
		return r.result(), r.status()
	}
	set := func(cdw11 uint32) Status {
		t.Helper()
		r, _, err := h.admin.do(CommandFields{Opcode: AdminSetFeatures, CDW10_15: [6]uint32{FeatTempThreshold, cdw11}}, cmdOpts{})
		if err != nil {
			t.Fatal(err)
		}
		return r.status()
	}
	warning := func() bool {
		t.Helper()
		b, st, err := h.getLog(LogSMART, smartLen, 0)
		if err != nil || st != StatusSuccess {
			t.Fatalf("SMART log: %v %v", st, err)
		}
		return b[0]&(1<<1) != 0
	}
	if v, st := get(0); st != StatusSuccess || v != 343 {
		t.Errorf("over-temperature threshold: %d %v, want 343", v, st)
	}
	if v, st := get(under); st != StatusSuccess || v != 0 {
		t.Errorf("under-temperature threshold: %d %v, want 0 (none)", v, st)
	}
	if warning() {
		t.Error("critical warning with 298 K between 0 and 343")
	}
	if st := set(under | 300); st != StatusSuccess {
		t.Fatalf("set under-temperature threshold: %v", st)
	}
	if v, st := get(under); st != StatusSuccess || v != 300 {
		t.Errorf("under-temperature threshold after setting 300: %d %v", v, st)
	}
	if v, _ := get(0); v != 343 {
		t.Errorf("over-temperature threshold changed by setting the under one: %d", v)
	}
	if !warning() {
		t.Error("no critical warning with 298 K under the under-temperature threshold of 300")
	}
	if set(under|0) != StatusSuccess || set(290) != StatusSuccess || !warning() {
		t.Error("no critical warning with 298 K over an over-temperature threshold of 290")
	}
	if set(343) != StatusSuccess || warning() {
		t.Error("critical warning with the thresholds back at 0 and 343")
	}
	if _, st := get(sensor1); st != StatusInvalidField|StatusDNR {
		t.Errorf("Get of temperature sensor 1 (none): %v, want %v", st, StatusInvalidField|StatusDNR)
	}
	if st := set(sensor1 | 350); st != StatusInvalidField|StatusDNR {
		t.Errorf("Set of temperature sensor 1 (none): %v, want %v", st, StatusInvalidField|StatusDNR)
	}
}
