package nvmf

import "testing"

// Conformance of the admin commands to the NVMe Base Specification 2.0
// and the NVM Command Set Specification 1.0, one test per rule, each over
// real loopback TCP with the test host.

// TestIdentifyNamespaceBroadcastRefused: this controller does not support
// Namespace Management (OACS bit 3 is 0), so Identify Namespace (CNS 00h)
// with NSID FFFFFFFFh is aborted with Invalid Namespace or Format (NVM
// Command Set 1.0 §4.1.5.1; NVMe 1.4 §5.15.2.1 before it), as Linux nvmet
// does. Namespace 1 is still identified after it.
func TestIdentifyNamespaceBroadcastRefused(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	_, st, err := h.identify(CNSNamespace, 0xffffffff)
	if err != nil {
		t.Fatal(err)
	}
	if want := StatusInvalidNS | StatusDNR; st != want {
		t.Fatalf("Identify Namespace of NSID FFFFFFFFh: %v, want %v", st, want)
	}
	b, st, err := h.identify(CNSNamespace, 1)
	if err != nil || st != StatusSuccess || IdentifyNamespace(b).NSZE() != 64<<20/4096 {
		t.Fatalf("Identify Namespace 1 after: %v %v", st, err)
	}
}

// TestGetFeaturesReservedSelectRefused: Get Features' Select field (CDW10
// bits 10:08) values 100b to 111b are reserved (NVMe Base 2.0, Get
// Features, Command Dword 10), and a reserved coded value in a defined
// field of a command is reported as an error (§1.4, the definition of
// reserved): Invalid Field in Command, for every feature,
// the Host Identifier's (which returns data) included.
func TestGetFeaturesReservedSelectRefused(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	for _, fid := range []uint32{FeatKATO, FeatNumQueues, FeatAsyncEvent, FeatVolatileWC, FeatHostID} {
		for sel := uint32(4); sel <= 7; sel++ {
			f := CommandFields{Opcode: AdminGetFeatures, CDW10_15: [6]uint32{fid | sel<<8}}
			o := cmdOpts{}
			if fid == FeatHostID {
				f.CDW10_15[1] = 1 // EXHID: the 128-bit identifier, 16 bytes of data
				o = cmdOpts{dir: dirToHost, data: make([]byte, 16)}
			}
			r, _, err := h.admin.do(f, o)
			if err != nil {
				t.Fatal(err)
			}
			if want := StatusInvalidField | StatusDNR; r.status() != want {
				t.Errorf("Get Features 0x%02x with SEL %03b: %v, want %v", fid, sel, r.status(), want)
			}
		}
	}
	// The defined values still work.
	for sel := uint32(0); sel <= 3; sel++ {
		r, _, err := h.admin.do(CommandFields{Opcode: AdminGetFeatures, CDW10_15: [6]uint32{FeatKATO | sel<<8}}, cmdOpts{})
		if err != nil || r.status() != StatusSuccess {
			t.Errorf("Get Features KATO with SEL %03b: %v %v", sel, r.status(), err)
		}
	}
}

// TestGetFeaturesDefaultAndSavedValues: Get Features with SEL 001b returns
// a feature's default value, not the value Set Features made current; and
// as nothing here is saveable, SEL 010b (saved) operates as 001b (NVMe
// Base 2.0, Get Features, Command Dword 10; Base 2.1 Figure 192 words the
// saved case as a shall). SEL 000b still returns the
// current value. The defaults: Asynchronous Event Configuration 0, the
// composite temperature's thresholds 343 K and 0 K, and the keep alive
// timeout the host gave in Connect.
func TestGetFeaturesDefaultAndSavedValues(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{kato: 10000})
	const under = 1 << 20
	for _, c := range []struct {
		name          string
		fid, cdw11    uint32 // cdw11 of Get: the threshold selected
		set           uint32
		current, dflt uint64
	}{
		{"async-event-config", FeatAsyncEvent, 0, 1 << 8, 1 << 8, 0},
		{"temp-over", FeatTempThreshold, 0, 300, 300, 343},
		{"temp-under", FeatTempThreshold, under, under | 200, 200, 0},
		{"kato", FeatKATO, 0, 30000, 30000, 10000},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _, err := h.admin.do(CommandFields{Opcode: AdminSetFeatures, CDW10_15: [6]uint32{c.fid, c.set}}, cmdOpts{})
			if err != nil || r.status() != StatusSuccess {
				t.Fatalf("Set Features 0x%02x: %v %v", c.fid, r.status(), err)
			}
			for sel, want := range []uint64{c.current, c.dflt, c.dflt} {
				f := CommandFields{Opcode: AdminGetFeatures, CDW10_15: [6]uint32{c.fid | uint32(sel)<<8, c.cdw11}}
				r, _, err := h.admin.do(f, cmdOpts{})
				if err != nil || r.status() != StatusSuccess {
					t.Fatalf("Get Features 0x%02x SEL %03b: %v %v", c.fid, sel, r.status(), err)
				}
				if r.result() != want {
					t.Errorf("Get Features 0x%02x SEL %03b: %d, want %d", c.fid, sel, r.result(), want)
				}
			}
		})
	}
}
