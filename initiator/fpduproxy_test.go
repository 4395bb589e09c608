package initiator_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/rnic/mpa"
)

// fpduProxy sits between an initiator and a real target. It passes the MPA
// Request and Reply through, then relays each direction FPDU by FPDU, CRCs
// as the Reply settled them: a hook sees each ULPDU and returns the framed
// FPDUs that go in its place, which lets a test play a hostile target (or
// watch what the initiator's RNIC sends).
type fpduProxy struct {
	l      net.Listener
	target string
	hooks  proxyHooks
	wg     sync.WaitGroup
}

type proxyHooks struct {
	// up and down see each ULPDU from the initiator and from the target;
	// nil passes it through.
	up, down func(u []byte, crc bool) []byte
	// upEnded runs when the initiator-to-target relay ends.
	upEnded func()
}

func newFPDUProxy(t *testing.T, target string, h proxyHooks) *fpduProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fpduProxy{l: l, target: target, hooks: h}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *fpduProxy) addr() string { return p.l.Addr().String() }

func (p *fpduProxy) serve() {
	defer p.wg.Done()
	for {
		ic, err := p.l.Accept()
		if err != nil {
			return
		}
		tc, err := net.Dial("tcp", p.target)
		if err != nil {
			ic.Close()
			continue
		}
		crc := make(chan bool, 1) // the Reply's CRC flag, for the upstream relay
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.relay(ic, tc, false, p.hooks.up, crc)
			tc.Close()
			if p.hooks.upEnded != nil {
				p.hooks.upEnded()
			}
		}()
		go func() { defer p.wg.Done(); p.relay(tc, ic, true, p.hooks.down, crc); ic.Close() }()
	}
}

// relay passes src's MPA frame (the Reply if reply) and then its FPDUs to
// dst, through hook.
func (p *fpduProxy) relay(src, dst net.Conn, reply bool, hook func([]byte, bool) []byte, crcc chan bool) {
	if reply {
		defer close(crcc)
	}
	var raw bytes.Buffer
	f, err := mpa.ReadFrame(io.TeeReader(src, &raw), reply)
	if err != nil {
		return
	}
	if _, err := dst.Write(raw.Bytes()); err != nil || f.Reject {
		return
	}
	crc := f.CRC
	if reply {
		crcc <- crc
	} else {
		var ok bool
		if crc, ok = <-crcc; !ok {
			return // the Reply never came
		}
	}
	rd := mpa.NewReader(src, mpa.ReaderConfig{CRC: crc})
	for {
		n, err := rd.Next()
		if err != nil {
			return
		}
		u := make([]byte, n)
		if rd.ReadFull(u) != nil || rd.Finish() != nil {
			return
		}
		var out []byte
		if hook != nil {
			out = hook(u, crc)
		} else {
			out = mpa.AppendFPDU(nil, u, nil, crc)
		}
		if _, err := dst.Write(out); err != nil {
			return
		}
	}
}
