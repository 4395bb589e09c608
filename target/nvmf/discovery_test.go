package nvmf

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/store"
)

// TestDiscovery: `nvme discover`'s exchange against the discovery
// controller: Identify (discovery type), the log header, then header and
// entries; each host sees the subsystems it may connect to.
func TestDiscovery(t *testing.T) {
	allowed := "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
	e := newTestEnv(t, envOpts{volumes: map[string]int64{"open": 8 << 20, "listed": 8 << 20, "b": 8 << 20},
		cfg: func(c *Config) { c.Hosts = map[string][]string{"listed": {allowed}} }})
	_, port, _ := net.SplitHostPort(e.addr)
	for _, c := range []struct {
		host string
		want []string
	}{
		{"nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002", []string{"b", "open"}},
		{allowed, []string{"b", "listed", "open"}},
	} {
		h := connectHost(t, e.addr, DiscoveryNQN, hostOpts{hostNQN: c.host, kato: 0})
		b, st, err := h.identify(CNSController, 0)
		if err != nil || st != StatusSuccess || IdentifyController(b).CntrlType() != CntrlTypeDiscovery ||
			IdentifyController(b).SubNQN() != DiscoveryNQN {
			t.Fatalf("Identify of the discovery controller: %v %v", st, err)
		}
		// Async event configuration and an AER, as nvme-cli does.
		f := CommandFields{Opcode: AdminSetFeatures, CDW10_15: [6]uint32{FeatAsyncEvent, 0x80000000}}
		if r, _, err := h.admin.do(f, cmdOpts{}); err != nil || r.status() != StatusSuccess {
			t.Fatalf("Set Features AEC: %v %v", r.status(), err)
		}
		go h.admin.do(CommandFields{Opcode: AdminAsyncEvent}, cmdOpts{timeout: time.Hour})
		hdr, st, err := h.getLog(LogDiscovery, DiscoveryHeaderLen, 0)
		if err != nil || st != StatusSuccess {
			t.Fatalf("discovery log header: %v %v", st, err)
		}
		n := DiscoveryHeader(hdr).NumRec()
		if n != uint64(len(c.want)) {
			t.Fatalf("host %s: %d records, want %v", c.host, n, c.want)
		}
		all, st, err := h.getLog(LogDiscovery, DiscoveryHeaderLen+int(n)*DiscoveryEntryLen, 0)
		if err != nil || st != StatusSuccess || DiscoveryHeader(all).GenCtr() != DiscoveryHeader(hdr).GenCtr() {
			t.Fatalf("discovery log: %v %v", st, err)
		}
		for i, v := range c.want {
			en := DiscoveryEntry(all[DiscoveryHeaderLen+i*DiscoveryEntryLen:])
			if en.SubNQN() != e.srv.NQN(v) || en.TrType() != TrTypeRDMA || en.AdrFam() != AdrFamIPv4 ||
				en.SubType() != SubTypeNVMe || en.TrAddr() != "127.0.0.1" || en.TrSvcID() != port ||
				en.CntlID() != DynamicCntlID || en.ASQSz() != AdminQueueSize || en.RDMAPrType() != RDMAPrTypeIWARP {
				t.Errorf("entry %d: %q %d/%d/%d %q:%q", i, en.SubNQN(), en.TrType(), en.AdrFam(), en.SubType(), en.TrAddr(), en.TrSvcID())
			}
		}
		// An entry read at an offset is the same.
		one, st, err := h.getLog(LogDiscovery, DiscoveryEntryLen, DiscoveryHeaderLen)
		if err != nil || st != StatusSuccess || DiscoveryEntry(one).SubNQN() != e.srv.NQN(c.want[0]) {
			t.Fatalf("entry at offset: %v %v", st, err)
		}
		if err := h.disconnect(); err != nil {
			t.Fatal(err)
		}
	}
	// Advertise replaces the address.
	e2 := newTestEnv(t, envOpts{cfg: func(c *Config) { c.Advertise = "[fd00::5]:4420" }})
	h := connectHost(t, e2.addr, DiscoveryNQN, hostOpts{})
	all, _, _ := h.getLog(LogDiscovery, 2048, 0)
	en := DiscoveryEntry(all[DiscoveryHeaderLen:])
	if en.AdrFam() != AdrFamIPv6 || en.TrAddr() != "fd00::5" || en.TrSvcID() != strconv.Itoa(4420) {
		t.Fatalf("advertised entry %d %q %q", en.AdrFam(), en.TrAddr(), en.TrSvcID())
	}
}

// TestDiscoveryLeavesOutUnavailable: a raw volume whose file is gone is
// not in the discovery log (a connect to it would fail), and the log's
// generation counter changes when it goes and when it comes back, so
// hosts that watch it see both.
func TestDiscoveryLeavesOutUnavailable(t *testing.T) {
	e := newTestEnv(t, envOpts{thin: true, volumes: map[string]int64{"thin": 8 << 20}})
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.CreateVolume(context.Background(), "raw", 0, store.CreateOptions{Raw: img}); err != nil {
		t.Fatal(err)
	}
	h := connectHost(t, e.addr, DiscoveryNQN, hostOpts{kato: 0})
	list := func(when string) (nqns []string, gen uint64) {
		t.Helper()
		b, st, err := h.getLog(LogDiscovery, DiscoveryHeaderLen+4*DiscoveryEntryLen, 0)
		if err != nil || st != StatusSuccess {
			t.Fatalf("%s: discovery log: %v %v", when, st, err)
		}
		for i := range DiscoveryHeader(b).NumRec() {
			nqns = append(nqns, DiscoveryEntry(b[DiscoveryHeaderLen+int(i)*DiscoveryEntryLen:]).SubNQN())
		}
		return nqns, DiscoveryHeader(b).GenCtr()
	}
	want := func(when string, got []string, names ...string) {
		t.Helper()
		if len(got) != len(names) {
			t.Fatalf("%s: log lists %q, want %q", when, got, names)
		}
		for i, n := range names {
			if got[i] != e.srv.NQN(n) {
				t.Fatalf("%s: log lists %q, want %q", when, got, names)
			}
		}
	}
	got, gen0 := list("served")
	want("served", got, "raw", "thin")
	if err := os.Remove(img); err != nil {
		t.Fatal(err)
	}
	got, gen1 := list("file gone")
	want("file gone", got, "thin")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	got, gen2 := list("file back")
	want("file back", got, "raw", "thin")
	if gen1 == gen0 || gen2 == gen1 {
		t.Errorf("generation counters %#x, %#x, %#x: want a change at each step", gen0, gen1, gen2)
	}
	if err := h.disconnect(); err != nil {
		t.Fatal(err)
	}
}
