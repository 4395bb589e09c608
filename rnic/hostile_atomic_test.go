package rnic

import (
	"encoding/binary"
	"math"
	"testing"
	"time"
	"unsafe"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// TestAtomicAlignedAddressAtOddTO: RFC 7306 §5.2.1: the Remote Tagged
// Offset "MAY start at an arbitrary offset but MUST represent a ULP Buffer
// address that is 64-bit aligned". A zero-based region whose first byte
// sits 4 bytes past an 8-byte boundary has its aligned words at TO 4, 12,
// ...: a FetchAdd at TO 4 targets an aligned address and must be executed,
// not refused as misaligned.
func TestAtomicAlignedAddressAtOddTO(t *testing.T) {
	tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true, InboundAtomic: true}, 0, 64)
	back := make([]uint64, 10) // 8-byte aligned
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&back[0])), 80)
	buf := raw[4:68] // first byte at an address = 4 mod 8
	binary.NativeEndian.PutUint64(buf[4:12], 0x29)
	mr, err := tt.pd.RegisterMR(Bytes(buf), MROptions{Access: LocalRead | LocalWrite | RemoteAtomic, ZeroBased: true})
	if err != nil {
		t.Fatal(err)
	}
	p := tt.dial(t, rawpeer.Options{CRC: true})
	sendULPDU(t, p, p.AtomicRequest(rdmap.AtomicRequestFields{AOpcode: rdmap.AtomicFetchAdd, ReqID: 7,
		STag: uint32(mr.STag()), TO: 4, AddSwap: 1, CompareMask: math.MaxUint64}))
	u, err := p.ReadULPDU(10 * time.Second)
	if err != nil {
		t.Fatalf("no answer to the FetchAdd: %v", err)
	}
	h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
	if ddp.IsTagged(u[0]) || h.QN() != rdmap.QNAtomicResponse {
		if !ddp.IsTagged(u[0]) && h.QN() == rdmap.QNTerminate {
			f, _ := rdmap.ParseTerminate(u[ddp.UntaggedHeaderLen:])
			t.Fatalf("FetchAdd at an aligned address (TO 4) answered with a Terminate: %s", f.Cause)
		}
		t.Fatalf("FetchAdd answered with %x", u)
	}
	resp := rdmap.AtomicResponse(u[ddp.UntaggedHeaderLen:])
	if resp.ReqID() != 7 || resp.Original() != 0x29 {
		t.Fatalf("Atomic Response %+v, want request 7, original 0x29", resp.Fields())
	}
	if v := binary.NativeEndian.Uint64(buf[4:12]); v != 0x2A {
		t.Fatalf("target word 0x%x after FetchAdd 1, want 0x2a", v)
	}
}
