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
