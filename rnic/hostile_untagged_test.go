package rnic

import (
	"fmt"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// TestSendZeroLengthFirstSegment: a Send whose first segment carries no
// payload (MO 0, L clear) is continued by a segment at MO 0 again. That
// segment belongs to the message in progress: it must not take a second
// receive WQE (the first would never complete, not even flushed, and its
// place in the RQ would be lost for good).
func TestSendZeroLengthFirstSegment(t *testing.T) {
	tt := newTermTarget(t, QPConfig{}, 2, 64)
	p := tt.dial(t, rawpeer.Options{CRC: true})
	msn := p.NextMSN(rdmap.QNSend)
	sendULPDU(t, p, p.Untagged(rdmap.OpSend, false, 0, rdmap.QNSend, msn, 0, nil))
	sendULPDU(t, p, p.Untagged(rdmap.OpSend, true, 0, rdmap.QNSend, msn, 0, []byte("hi")))
	sendULPDU(t, p, p.SendMsg(rdmap.OpSend, 0, []byte("yo")))
	for i, want := range []struct {
		id   uint64
		data string
	}{{0, "hi"}, {1, "yo"}} {
		wc := tt.wait(tt.rcq)
		if wc.Status != StatusSuccess || wc.ID != want.id || wc.Bytes != uint32(len(want.data)) {
			t.Fatalf("receive completion %d: %+v, want ID %d success with %d bytes", i, wc, want.id, len(want.data))
		}
		off := int(want.id) * 64
		if got := string(tt.bufs["recv"][off : off+len(want.data)]); got != want.data {
			t.Fatalf("receive %d holds %q, want %q", want.id, got, want.data)
		}
	}
	if st := tt.qp.State(); st != StateRTS {
		t.Fatalf("QP in %s after two well-formed Sends", st)
	}
}

// TestSendSegmentsDisagree: every segment of an untagged message carries
// its first segment's RsvdULP (RFC 5041 §4.3), that is, for RDMAP, its
// opcode, its RDMAP version and, for a Send with Invalidate, its
// Invalidate STag. A later segment that names another opcode is refused as
// an invalid opcode (RFC 5040 §7.2 step 2: Remote Operation / Unexpected
// OpCode, 0/2/0x06), one with another version (both 01b and 00b are valid
// on their own) as an invalid version (step 3: Remote Operation / Invalid
// RDMAP Version, 0/2/0x05), one that names another Invalidate STag as an
// invalid Invalidate STag (step 4: Remote Protection / Invalid STag,
// 0/1/0x00). The Terminate echoes the bad segment's DDP header; its
// payload is not placed, no STag is invalidated and the receive does not
// complete successfully.
func TestSendSegmentsDisagree(t *testing.T) {
	cases := []struct {
		name          string
		first, second rdmap.Opcode
		// rdmac1 and rdmac2 send the first or the second segment with
		// RDMAP version 00b (the RDMA Consortium's) instead of 01b.
		rdmac1, rdmac2 bool
		// inv names the STags the two segments carry: the target's
		// regions "w" and "va" (both remotely invalidatable).
		inv1, inv2 string
		cause      term.Cause
		ev         EventType
	}{
		{name: "send-then-send-se", first: rdmap.OpSend, second: rdmap.OpSendSE,
			cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode},
		{name: "send-se-then-send", first: rdmap.OpSendSE, second: rdmap.OpSend,
			cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode},
		{name: "send-then-send-inv", first: rdmap.OpSend, second: rdmap.OpSendInv, inv2: "w",
			cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode},
		{name: "send-inv-then-send-se-inv", first: rdmap.OpSendInv, second: rdmap.OpSendSEInv, inv1: "w", inv2: "w",
			cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode},
		{name: "send-then-immediate", first: rdmap.OpSend, second: rdmap.OpImmediate,
			cause: remoteOp(term.OpUnexpectedOpcode), ev: EventUnexpectedOpcode},
		{name: "send-inv-stag-changes", first: rdmap.OpSendInv, second: rdmap.OpSendInv, inv1: "w", inv2: "va",
			cause: prot(term.ProtInvalidSTag), ev: EventInvalidSTag},
		{name: "send-se-inv-stag-changes", first: rdmap.OpSendSEInv, second: rdmap.OpSendSEInv, inv1: "va", inv2: "w",
			cause: prot(term.ProtInvalidSTag), ev: EventInvalidSTag},
		{name: "send-then-rdmac-send", first: rdmap.OpSend, second: rdmap.OpSend, rdmac2: true,
			cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion},
		{name: "rdmac-send-se-then-send-se", first: rdmap.OpSendSE, second: rdmap.OpSendSE, rdmac1: true,
			cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion},
		{name: "rdmac-send-inv-then-send-inv", first: rdmap.OpSendInv, second: rdmap.OpSendInv, inv1: "w", inv2: "w",
			rdmac1: true, cause: remoteOp(term.OpInvalidVersion), ev: EventInvalidRDMAVersion},
	}
	// rdmac sets a ULPDU's RDMAP version to 00b.
	rdmac := func(u []byte, on bool) []byte {
		if on {
			u[1] = u[1]&^0xC0 | rdmap.VersionRDMAC<<6
		}
		return u
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tt := newTermTarget(t, QPConfig{InboundRead: true, InboundWrite: true}, 1, 64)
			mrs := map[string]*MR{"w": tt.w, "va": tt.va}
			stag := func(name string) uint32 {
				if name == "" {
					return 0
				}
				return uint32(mrs[name].STag())
			}
			p := tt.dial(t, rawpeer.Options{CRC: true})
			msn := p.NextMSN(rdmap.QNSend)
			sendULPDU(t, p, rdmac(p.Untagged(tc.first, false, stag(tc.inv1), rdmap.QNSend, msn, 0, []byte("ab")), tc.rdmac1))
			payload := []byte("cd")
			if tc.second == rdmap.OpImmediate {
				payload = []byte("cdefghij")
			}
			bad := sendULPDU(t, p, rdmac(p.Untagged(tc.second, true, stag(tc.inv2), rdmap.QNSend, msn, 2, payload), tc.rdmac2))
			tm, _, err := p.ReadTerminate(10 * time.Second)
			if err != nil {
				var valid []string
				for name, mr := range mrs {
					info, _ := mr.Query()
					valid = append(valid, fmt.Sprintf("%s valid=%v", name, info.Valid))
				}
				t.Fatalf("no Terminate (%v); QP %s, receive completions %+v, %s", err, tt.qp.State(), drainCQ(tt.rcq), valid)
			}
			if tm.Cause != tc.cause {
				t.Fatalf("Terminate cause %s, want %s (%x)", tm.Cause, tc.cause, tm.Raw)
			}
			checkEcho(t, termCase{}, tm, bad)
			closeWrite(p.Conn)
			if err := p.WaitClosed(5 * time.Second); err != nil {
				t.Errorf("target did not close after its Terminate: %v", err)
			}
			tt.waitState(StateError)
			if ev := tt.waitEvent(tc.ev); ev.Terminate == nil || ev.Terminate.Cause != tc.cause {
				t.Errorf("event %+v", ev)
			}
			wcs := drainCQ(tt.rcq)
			if len(wcs) != 1 || wcs[0].Status == StatusSuccess {
				t.Fatalf("receive completions %+v, want one unsuccessful", wcs)
			}
			recv := tt.bufs["recv"]
			if string(recv[:2]) != "ab" {
				t.Errorf("the first segment's payload was not placed: %x", recv[:2])
			}
			for i, v := range recv[2:] {
				if v != sentinel {
					t.Fatalf("the bad segment was placed: receive buffer changed at offset %d: %#x", 2+i, v)
				}
			}
			delete(tt.bufs, "recv")
			tt.untouched(t)
			for name, mr := range mrs {
				if info, err := mr.Query(); err != nil || !info.Valid {
					t.Errorf("region %s invalidated: %+v %v", name, info, err)
				}
			}
		})
	}
}
