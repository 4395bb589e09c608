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
