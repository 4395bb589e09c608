package linuxvm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSiwResponder plays an MPA initiator and rping client by hand (raw bytes
// over TCP) against a siw rping server in the VM, one fresh server per
// scenario, and checks how siw answers: RTR negotiation, CRC, markers, IRD/ORD
// clamping, the rping exchange itself, and its Terminates. Both siw builds
// answer alike: the crc1 build's settings only shape what it sends as
// initiator.
func TestSiwResponder(t *testing.T) {
	cache := vmCache(t)
	for _, v := range []Variant{Stock, CRC1} {
		t.Run(string(v), func(t *testing.T) { testResponder(t, cache, v) })
	}
}

func testResponder(t *testing.T, cache string, v Variant) {
	share := t.TempDir()
	scenarios := []struct {
		name string
		run  func(t *testing.T, p *peerConn) // guest output lines of this server are checked by check
		// check looks at the rping server's output (lines without prefix).
		check func(t *testing.T, out []string)
	}{
		{"p2p-write-and-read-rtr-offered", scenarioRTR(0xC000, 0x8000), wantPings(2)},
		{"p2p-read-rtr-only", scenarioRTR(0x4000, 0x4000), wantPings(2)},
		{"p2p-no-rtr-type", scenarioRTR(0x0000, 0x8000), wantPings(2)},
		{"plain-rev2", scenarioPlain(0x10, 2, true), wantPings(2)},
		{"crc-requested", scenarioPlain(0x10|0x40, 2, true), wantPings(2)},
		{"rev1-no-irdord", scenarioRev1, wantOutput("post send error")},
		{"markers-rejected", scenarioMarkers, nil},
		{"ird-ord-clamped", scenarioIRDClamp, wantPings(1)},
		{"bad-stag-terminate", scenarioBadSTag, nil},
		{"bad-opcode-terminate", scenarioBadOpcode, nil},
		{"bad-read-stag-terminate", scenarioBadReadSTag, nil},
	}
	// One port per scenario: a closed connection leaves the port busy (TIME_WAIT)
	// for rdma_bind_addr for a minute.
	ports := forwardPorts(t, len(scenarios))
	portList := make([]string, len(scenarios))
	for i, p := range ports {
		portList[i] = strconv.Itoa(p)
	}
	script := fmt.Sprintf(`
set -- %s
waitlisten() { local w=0; while ! netstat -ltn 2>/dev/null | grep -q ":$1 "; do
  w=$((w+1)); [ $w -gt 300 ] && return 1; sleep 0.1; done; }
dmesg -c >/dev/null
i=0
for P in "$@"; do
  i=$((i+1))
  rping -s -a 10.0.2.15 -p $P -S 256 -v >/tmp/r 2>&1 &
  pid=$!
  waitlisten $P && echo "PROBE ready $i" || { echo "PROBE not listening $i"; cat /tmp/r; }
  while [ ! -e /host/done.$i ]; do sleep 0.1; done
  sleep 0.5; kill $pid 2>/dev/null; wait $pid; rc=$?
  sed "s/^/PROBE-OUT $i /" /tmp/r; echo "PROBE rc $i $rc"
  dmesg -c | grep -i -e siw -e iw_ -e rdma | sed "s/^/PROBE-DMESG $i /"; echo "PROBE finished $i"
done
`, strings.Join(portList, " "))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	vm, err := Boot(ctx, Config{CacheDir: cache, Variant: v, GuestScript: script, ShareDir: share,
		Forwards: ports, Timeout: 8 * time.Minute, Log: func(l string) {
			if !strings.HasPrefix(l, "PROBE-OUT") {
				t.Logf("guest: %s", l)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		vm.Stop()
		res, err := vm.Wait()
		if t.Failed() && res != nil {
			t.Logf("VM: %v\nkernel console:\n%s", err, res.Console)
		}
	}()
	for i, sc := range scenarios {
		n := i + 1
		ok := t.Run(sc.name, func(t *testing.T) {
			if _, err := vm.WaitFor(ctx, fmt.Sprintf("PROBE ready %d", n)); err != nil {
				t.Fatal(err)
			}
			defer func() {
				// Whatever happened, let the guest move on and show its side.
				if err := os.WriteFile(filepath.Join(share, fmt.Sprintf("done.%d", n)), nil, 0o644); err != nil {
					t.Error(err)
				}
				if _, err := vm.WaitFor(ctx, fmt.Sprintf("PROBE finished %d", n)); err != nil {
					t.Error(err)
				}
			}()
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])))
			if err != nil {
				t.Fatal(err)
			}
			func() {
				defer c.Close()
				sc.run(t, &peerConn{t: t, c: c})
			}()
			if err := os.WriteFile(filepath.Join(share, fmt.Sprintf("done.%d", n)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := vm.WaitFor(ctx, fmt.Sprintf("PROBE finished %d", n)); err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("PROBE-OUT %d ", n)
			var out []string
			for _, l := range vm.Lines() {
				if rest, ok := strings.CutPrefix(l, prefix); ok {
					out = append(out, rest)
					t.Logf("rping server: %s", rest)
				}
			}
			if sc.check != nil {
				sc.check(t, out)
			}
		})
		if !ok && ctx.Err() != nil {
			break
		}
	}
}

func wantPings(n int) func(*testing.T, []string) {
	return func(t *testing.T, out []string) {
		t.Helper()
		for i := 0; i < n; i++ {
			want := "server ping data: " + rpingPattern(i, 256)
			found := false
			for _, l := range out {
				found = found || l == want
			}
			if !found {
				t.Errorf("rping server did not print ping %d", i)
			}
		}
	}
}

func wantOutput(s string) func(*testing.T, []string) {
	return func(t *testing.T, out []string) {
		t.Helper()
		for _, l := range out {
			if strings.Contains(l, s) {
				return
			}
		}
		t.Errorf("rping server output lacks %q", s)
	}
}

// connect sends an MPA Request and reads the Reply.
func (p *peerConn) connect(flags, rev byte, pd []byte) mpaRR {
	p.t.Helper()
	p.send(mpaRequest(flags, rev, pd))
	p.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	rep, err := readMPARR(p.c)
	if err != nil {
		p.t.Fatalf("MPA reply: %v", err)
	}
	p.t.Logf("<- MPA reply % x", []byte(rep))
	if rep.Key() != "MPA ID Rep Frame" {
		p.t.Fatalf("reply key %q", rep.Key())
	}
	p.crc = rep.CRC() || flags&0x40 != 0
	// The responder sends nothing first. The pause also steps around a siw
	// race: siw enters RDMA mode before it sends the Reply but hooks the QP
	// to the socket only after, and an FPDU landing in between stays unread
	// until more data arrives (siw_accept, siw_cm_llp_data_ready).
	if !rep.Reject() {
		p.expectQuiet(500 * time.Millisecond)
	}
	return rep
}

const (
	startSTag, startTO = 0x5ca1ab00, 0x10000
	sinkSTag, sinkTO   = 0x5ca1ac00, 0x20000
)

// pingAdvert is rping's struct rping_rdma_info {be64 buf; be32 rkey; be32 size}.
func pingAdvert(to uint64, stag, size uint32) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, to)
	binary.BigEndian.PutUint32(b[8:], stag)
	binary.BigEndian.PutUint32(b[12:], size)
	return b
}

// rpingPings runs count rping iterations of 256 bytes as the client. Our
// Sends carry MSN 1, 2, ...; the server's Sends and Read Requests have their
// own sequences. readMSN0 is the MSN of the first Read Request expected.
func (p *peerConn) rpingPings(count int, readMSN0 uint32) {
	p.t.Helper()
	const size = 256
	d := 20 * time.Second
	msn, readMSN, srvMSN := uint32(1), readMSN0, uint32(1)
	for ping := 0; ping < count; ping++ {
		data := append([]byte(rpingPattern(ping, size)), 0)
		p.sendSeg(untagged(opSend, 0, msn, 0, pingAdvert(startTO, startSTag, size)))
		msn++
		rr, err := p.recvSeg(d)
		if err != nil {
			p.t.Fatalf("ping %d: want Read Request: %v", ping, err)
		}
		pl := rr.Payload()
		if rr.Opcode() != opReadReq || rr.Tagged() || rr.QN() != 1 || rr.MSN() != readMSN || len(pl) != 28 {
			p.t.Fatalf("ping %d: want Read Request QN 1 MSN %d, got % x", ping, readMSN, []byte(rr))
		}
		readMSN++
		rSinkSTag, rSinkTO := binary.BigEndian.Uint32(pl), binary.BigEndian.Uint64(pl[4:])
		rSize, rSrcSTag, rSrcTO := binary.BigEndian.Uint32(pl[12:]), binary.BigEndian.Uint32(pl[16:]), binary.BigEndian.Uint64(pl[20:])
		if rSize != size || rSrcSTag != startSTag || rSrcTO != startTO {
			p.t.Fatalf("ping %d: Read Request size %d src %#x/%#x", ping, rSize, rSrcSTag, rSrcTO)
		}
		p.sendSeg(tagged(opReadResp, rSinkSTag, rSinkTO, data))
		goAhead := func(what string) {
			s, err := p.recvSeg(d)
			if err != nil {
				p.t.Fatalf("ping %d: want Send (%s): %v", ping, what, err)
			}
			if s.Opcode() != opSend || s.Tagged() || s.QN() != 0 || s.MSN() != srvMSN || len(s.Payload()) != 16 {
				p.t.Fatalf("ping %d: want Send QN 0 MSN %d (%s), got % x", ping, srvMSN, what, []byte(s))
			}
			srvMSN++
		}
		goAhead("after read")
		p.sendSeg(untagged(opSend, 0, msn, 0, pingAdvert(sinkTO, sinkSTag, size)))
		msn++
		w, err := p.recvSeg(d)
		if err != nil {
			p.t.Fatalf("ping %d: want Write: %v", ping, err)
		}
		if w.Opcode() != opWrite || !w.Tagged() || w.STag() != sinkSTag || w.TO() != sinkTO || !bytes.Equal(w.Payload(), data) {
			p.t.Fatalf("ping %d: Write % x", ping, []byte(w))
		}
		goAhead("after write")
	}
}

// closeAndWatch half-closes our side and reports what the guest sends until
// it closes.
func (p *peerConn) closeAndWatch() {
	p.t.Helper()
	p.c.(*net.TCPConn).CloseWrite()
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(p.c)
	p.t.Logf("after our FIN: guest sent %d more bytes (% x), then %v", len(rest), rest, errOrEOF(err))
	if len(rest) != 0 {
		p.t.Errorf("guest sent data after our FIN: % x", rest)
	}
	if err != nil {
		p.t.Errorf("guest did not close after our FIN: %v", err)
	}
}

func errOrEOF(err error) string {
	if err == nil {
		return "EOF"
	}
	return err.Error()
}

// scenarioRTR offers P2P with the given RTR bits in the ORD word and expects
// siw to choose want. It then sends that RTR and runs two pings.
func scenarioRTR(offer, want uint16) func(*testing.T, *peerConn) {
	return func(t *testing.T, p *peerConn) {
		rep := p.connect(0x10, 2, irdORD(0x8000|1, offer|1))
		ird, ord, ok := rep.IRDORD()
		if !ok || rep.Rev() != 2 || ird&0x8000 == 0 || ord&0xC000 != want || ird&0x3fff != 1 || ord&0x3fff != 1 {
			t.Fatalf("offer %#04x: reply % x, want P2P, RTR %#04x, IRD=ORD=1", offer, []byte(rep), want)
		}
		readMSN := uint32(1)
		switch want {
		case 0x8000: // zero-length RDMA Write, STag 1 TO 0 as siw itself sends
			p.sendSeg(tagged(opWrite, 1, 0, nil))
		case 0x4000: // zero-length RDMA Read Request: it uses MSN 1 of our QN 1
			rr := make([]byte, 28)
			binary.BigEndian.PutUint32(rr, 1)      // sink STag
			binary.BigEndian.PutUint32(rr[16:], 1) // source STag
			p.sendSeg(untagged(opReadReq, 1, 1, 0, rr))
			s, err := p.recvSeg(10 * time.Second)
			if err != nil {
				t.Fatalf("want zero-length Read Response to the RTR: %v", err)
			}
			if s.Opcode() != opReadResp || !s.Tagged() || s.STag() != 1 || s.TO() != 0 || len(s.Payload()) != 0 {
				t.Fatalf("RTR Read Response % x", []byte(s))
			}
		}
		p.rpingPings(2, readMSN)
		p.closeAndWatch()
	}
}

// scenarioPlain connects without P2P and runs two pings.
func scenarioPlain(flags, rev byte, enhanced bool) func(*testing.T, *peerConn) {
	return func(t *testing.T, p *peerConn) {
		var pd []byte
		if enhanced {
			pd = irdORD(1, 1)
		}
		rep := p.connect(flags, rev, pd)
		if rep.Rev() != rev || rep.CRC() != (flags&0x40 != 0) || rep.Markers() || rep.Reject() {
			t.Fatalf("reply % x for flags %#02x rev %d", []byte(rep), flags, rev)
		}
		p.rpingPings(2, 1)
		p.closeAndWatch()
	}
}

// scenarioRev1: MPA rev 1 has no IRD/ORD; siw passes 0/0 up and rping's
// rdma_accept(NULL) leaves ORD 0, so the server cannot issue its Read.
func scenarioRev1(t *testing.T, p *peerConn) {
	rep := p.connect(0, 1, nil)
	if rep.Rev() != 1 || rep.CRC() || rep.Enhanced() || rep.PDLength() != 0 {
		t.Fatalf("rev 1 reply % x", []byte(rep))
	}
	p.sendSeg(untagged(opSend, 0, 1, 0, pingAdvert(startTO, startSTag, 256)))
	// The server's RDMA Read fails to post (ORD 0), rping gives up and
	// disconnects: a plain FIN, no Read Request, no Terminate.
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(p.c)
	t.Logf("rev 1: after our Send the guest sent % x, then %s", rest, errOrEOF(err))
	if len(rest) != 0 || err != nil {
		t.Errorf("want a bare close from the guest, got % x, %v", rest, err)
	}
}

// scenarioMarkers: siw supports no markers and rejects.
func scenarioMarkers(t *testing.T, p *peerConn) {
	rep := p.connect(0x80|0x10, 2, irdORD(1, 1))
	if !rep.Reject() || rep.Markers() {
		t.Fatalf("markers: reply % x, want Reject and no M", []byte(rep))
	}
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(p.c)
	t.Logf("markers: after the reject the guest sent % x, then %s", rest, errOrEOF(err))
	if err != nil {
		t.Errorf("siw did not close after rejecting: %v", err)
	}
}

// scenarioIRDClamp offers IRD=ORD=0x3fff; the reply must not exceed it.
func scenarioIRDClamp(t *testing.T, p *peerConn) {
	rep := p.connect(0x10, 2, irdORD(0x3fff, 0x3fff))
	ird, ord, ok := rep.IRDORD()
	t.Logf("offered IRD=ORD=0x3fff, reply IRD %d ORD %d", ird, ord)
	if !ok || ird > 0x3fff || ord > 0x3fff || ird == 0 || ord == 0 {
		t.Fatalf("reply % x", []byte(rep))
	}
	p.rpingPings(1, 1)
	p.closeAndWatch()
}

// readTerminate reads the next FPDU, which must be a Terminate, and returns
// its Terminate payload.
func (p *peerConn) readTerminate() []byte {
	p.t.Helper()
	s, err := p.recvSeg(10 * time.Second)
	if err != nil {
		p.t.Fatalf("want Terminate: %v", err)
	}
	pl := s.Payload()
	if s.Opcode() != opTerminate || s.Tagged() || s.QN() != 2 || s.MSN() != 1 || s.MO() != 0 || len(pl) < 4 {
		p.t.Fatalf("want Terminate on QN 2 MSN 1, got % x", []byte(s))
	}
	p.t.Logf("Terminate control % x, then % x", pl[:4], pl[4:])
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(p.c)
	p.t.Logf("after the Terminate: % x, then %s", rest, errOrEOF(err))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		p.t.Errorf("siw kept the connection open after its Terminate")
	}
	return pl
}

// scenarioBadOpcode sends an untagged segment with RDMAP opcode 0xf.
// siw answers RDMAP layer (0), Remote Operation (2), Unexpected OpCode (0x06)
// with no echoed headers; byte 0 shows where siw puts Layer and EType.
func scenarioBadOpcode(t *testing.T, p *peerConn) {
	p.connect(0x10, 2, irdORD(1, 1))
	p.sendSeg(untagged(0x0f, 0, 1, 0, make([]byte, 16)))
	pl := p.readTerminate()
	if len(pl) != 4 || pl[1] != 0x06 || pl[2] != 0 || pl[3] != 0 {
		t.Errorf("Terminate % x, want 4 bytes, ecode 0x06 (Unexpected OpCode), no M/D/R", pl)
	}
	// RFC 5040: Layer is the high nibble. siw on little-endian hosts fills a
	// C bitfield that puts Layer in the low nibble.
	switch pl[0] {
	case 0x02:
		t.Logf("byte 0 = 0x02: Layer 0 in the high nibble, EType 2 in the low one (RFC order)")
	case 0x20:
		t.Logf("byte 0 = 0x20: EType in the high nibble, Layer in the low one (nibbles swapped against RFC 5040)")
	default:
		t.Errorf("Terminate byte 0 %#02x, want RDMAP/Remote Operation in either nibble order", pl[0])
	}
}

// scenarioBadSTag writes to an STag siw never issued and expects a
// Terminate (DDP layer, tagged buffer error, invalid STag).
func scenarioBadSTag(t *testing.T, p *peerConn) {
	p.connect(0x10, 2, irdORD(1, 1))
	p.sendSeg(tagged(opWrite, 0xdeadbe01, 0, []byte("boom")))
	pl := p.readTerminate()
	// DDP (1) / tagged buffer (1) / invalid STag (0); M and D set; the
	// "DDP Segment Length" is siw's payload length (4), then our 14-byte
	// tagged DDP header.
	want := []byte{0xc1, 0x40, 0xde, 0xad, 0xbe, 0x01, 0, 0, 0, 0, 0, 0, 0, 0}
	if len(pl) != 20 || pl[0] != 0x11 || pl[1] != 0 || !bytes.Equal(pl[6:], want) {
		t.Fatalf("Terminate payload % x", pl)
	}
	t.Logf("M/D byte %#02x (RFC 5040 masks: M 0x80, D 0x40, R 0x20), DDP Segment Length %d",
		pl[2], binary.BigEndian.Uint16(pl[4:6]))
}

// scenarioBadReadSTag sends a Read Request for an STag siw never issued:
// RDMAP (0) / Remote Protection (1) / invalid STag (0), with M, D and R set
// and the Read Request echoed.
func scenarioBadReadSTag(t *testing.T, p *peerConn) {
	p.connect(0x10, 2, irdORD(1, 1))
	rr := make([]byte, 28)
	binary.BigEndian.PutUint32(rr, sinkSTag)
	binary.BigEndian.PutUint64(rr[4:], sinkTO)
	binary.BigEndian.PutUint32(rr[12:], 16)
	binary.BigEndian.PutUint32(rr[16:], 0xdeadbe01)
	req := untagged(opReadReq, 1, 1, 0, rr)
	p.sendSeg(req)
	pl := p.readTerminate()
	if len(pl) < 4 || (pl[0] != 0x10 && pl[0] != 0x01) || pl[1] != 0 {
		t.Fatalf("Terminate % x, want RDMAP/Remote Protection/invalid STag", pl)
	}
	// Observed: control 10 00 07 00 (EType high, Layer low; M|D|R = 0x07),
	// "DDP Segment Length" 0, then our 46-byte Read Request header as siw
	// rebuilt it from its send queue: every field ours except the MSN, where
	// siw puts the read size (siw_qp.c: ddp_msn = sge[0].length).
	if len(pl) != 4+2+len(req) || pl[2] != 0x07 {
		t.Fatalf("Terminate % x: want control, 2-byte length, %d-byte Read Request", pl, len(req))
	}
	echo := append([]byte(nil), pl[6:]...)
	t.Logf("DDP Segment Length %d, echoed MSN %d (sent 1), read size 16",
		binary.BigEndian.Uint16(pl[4:6]), binary.BigEndian.Uint32(echo[10:14]))
	copy(echo[10:14], req[10:14])
	if !bytes.Equal(echo, req) {
		t.Errorf("echoed header % x, sent % x", pl[6:], req)
	}
}
