// Package rawpeer is a byte-level iWARP peer for tests: it performs the MPA
// exchange as Initiator and then sends whatever FPDUs a test builds, well
// formed or not, and reads back what the other side sends (typically a
// Terminate). It keeps no RDMA state beyond the MSN counters it is asked to
// use: tests choose every header field.
package rawpeer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/rnic/ddp"
	"github.com/rnic-dev/rnic/rnic/mpa"
	"github.com/rnic-dev/rnic/rnic/rdmap"
)

// Options shape the MPA Request.
type Options struct {
	Rev         int  // 1 or 2 (default 2)
	CRC         bool // ask for CRC
	PrivateData []byte
	IRD, ORD    uint16 // rev 2 (default 16/16)
	// NoRTR skips sending the zero-length Write RTR the Responder chose.
	NoRTR bool
	// RawRequest, when not nil, is written as the MPA Request exactly as
	// it is, unchecked (for malformed Requests: PD_Length over 512,
	// reserved bits...). CRC still says whether this peer uses CRCs.
	RawRequest []byte
	// EarlyData is written right after the Request, before the Reply is
	// read: bytes (typically an FPDU) the Initiator must not send before
	// it has the Reply (RFC 5044 §7.1).
	EarlyData []byte
	// Mangle, when set, is applied to every ULPDU that Send frames (the
	// RTR included) just before framing, e.g. to set reserved bits.
	Mangle func(ulpdu []byte)
}

// ErrNoReply is returned (wrapped) by Dial and Handshake when the Responder
// ended the stream (FIN or reset) without sending a single byte of an MPA
// Reply.
var ErrNoReply = errors.New("rawpeer: the Responder closed without an MPA Reply")

// BuildRequest returns the MPA Request that o describes (RawRequest aside).
func BuildRequest(o Options) ([]byte, error) {
	if o.Rev == 0 {
		o.Rev = 2
	}
	req := mpa.Frame{CRC: o.CRC, Rev: uint8(o.Rev), PrivateData: o.PrivateData}
	if o.Rev == 2 {
		ird, ord := o.IRD, o.ORD
		if ird == 0 {
			ird = 16
		}
		if ord == 0 {
			ord = 16
		}
		req.Enhanced = &mpa.IRDORD{IRD: ird, ORD: ord, P2P: true, RTRWrite: true}
	}
	b, err := req.Append(nil)
	if err != nil {
		return nil, fmt.Errorf("rawpeer: MPA Request: %w", err)
	}
	return b, nil
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

// Peer is one raw connection in RDMA mode.
type Peer struct {
	Conn  net.Conn
	CRC   bool
	Reply mpa.Frame
	// Mangle, when set, changes every ULPDU Send frames (Options.Mangle).
	Mangle func(ulpdu []byte)
	rd     *mpa.Reader
	msn    ddp.TxQueues
}

// Dial connects to addr, exchanges MPA frames and, for a revision 2 peer
// that asked for one, sends the zero-length Write RTR.
func Dial(ctx context.Context, addr string, o Options) (*Peer, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rawpeer: dial %s: %w", addr, err)
	}
	p, err := Handshake(c, o)
	if err != nil {
		c.Close()
		return nil, err
	}
	return p, nil
}

// Handshake runs the MPA Initiator exchange on c.
func Handshake(c net.Conn, o Options) (*Peer, error) {
	b := o.RawRequest
	if b == nil {
		var err error
		if b, err = BuildRequest(o); err != nil {
			return nil, err
		}
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(b); err != nil {
		return nil, fmt.Errorf("rawpeer: send MPA Request: %w", err)
	}
	if len(o.EarlyData) > 0 {
		if _, err := c.Write(o.EarlyData); err != nil {
			return nil, fmt.Errorf("rawpeer: send data before the MPA Reply: %w", err)
		}
	}
	cr := &countReader{r: c}
	rep, err := mpa.ReadFrame(cr, true)
	if err != nil {
		if cr.n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return nil, fmt.Errorf("%w: %w", ErrNoReply, err)
		}
		return nil, fmt.Errorf("rawpeer: read MPA Reply: %w", err)
	}
	if rep.Reject {
		return nil, fmt.Errorf("rawpeer: rejected (%q)", rep.PrivateData)
	}
	p := &Peer{Conn: c, CRC: o.CRC || rep.CRC, Reply: rep, Mangle: o.Mangle}
	p.rd = mpa.NewReader(c, mpa.ReaderConfig{CRC: p.CRC})
	if rep.Enhanced != nil && rep.Enhanced.P2P && !o.NoRTR {
		if err := p.Send(p.Tagged(rdmap.OpWrite, true, 0, 0, nil)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// NextMSN returns the next MSN of queue qn (starting at 1) and advances it.
func (p *Peer) NextMSN(qn uint32) uint32 { return p.msn.Next(qn) }

// Untagged builds an untagged ULPDU: DDP header with the RDMAP control byte
// of op, then payload.
func (p *Peer) Untagged(op rdmap.Opcode, last bool, inv, qn, msn, mo uint32, payload []byte) []byte {
	b := make([]byte, ddp.UntaggedHeaderLen, ddp.UntaggedHeaderLen+len(payload))
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: last, RsvdULP0: rdmap.Ctrl(op), RsvdULP1: inv, QN: qn, MSN: msn, MO: mo})
	return append(b, payload...)
}

// Tagged builds a tagged ULPDU.
func (p *Peer) Tagged(op rdmap.Opcode, last bool, stag uint32, to uint64, payload []byte) []byte {
	b := make([]byte, ddp.TaggedHeaderLen, ddp.TaggedHeaderLen+len(payload))
	ddp.Tagged(b).Encode(&ddp.TaggedFields{Last: last, RsvdULP: rdmap.Ctrl(op), STag: stag, TO: to})
	return append(b, payload...)
}

// ReadRequest builds a Read Request ULPDU on QN 1 with the next MSN.
func (p *Peer) ReadRequest(f rdmap.ReadRequestFields) []byte {
	var body [rdmap.ReadRequestLen]byte
	rdmap.ReadRequest(body[:]).Encode(&f)
	return p.Untagged(rdmap.OpReadRequest, true, 0, rdmap.QNReadRequest, p.NextMSN(rdmap.QNReadRequest), 0, body[:])
}

// AtomicRequest builds an Atomic Request ULPDU on QN 1 with the next MSN.
func (p *Peer) AtomicRequest(f rdmap.AtomicRequestFields) []byte {
	var body [rdmap.AtomicRequestLen]byte
	rdmap.AtomicRequest(body[:]).Encode(&f)
	return p.Untagged(rdmap.OpAtomicRequest, true, 0, rdmap.QNReadRequest, p.NextMSN(rdmap.QNReadRequest), 0, body[:])
}

// SendMsg builds a single-segment Send-type ULPDU on QN 0 with the next MSN.
func (p *Peer) SendMsg(op rdmap.Opcode, inv uint32, payload []byte) []byte {
	return p.Untagged(op, true, inv, rdmap.QNSend, p.NextMSN(rdmap.QNSend), 0, payload)
}

// Send frames ulpdu as an FPDU (CRC as negotiated) and writes it. Mangle,
// if set, changes ulpdu first.
func (p *Peer) Send(ulpdu []byte) error {
	return p.SendRaw(p.Frame(ulpdu))
}

// Frame returns ulpdu framed as an FPDU (CRC as negotiated, Mangle
// applied), for tests that write several FPDUs at once.
func (p *Peer) Frame(ulpdu []byte) []byte {
	if p.Mangle != nil {
		p.Mangle(ulpdu)
	}
	return mpa.AppendFPDU(nil, ulpdu, nil, p.CRC)
}

// SendBadCRC frames ulpdu with a wrong CRC.
func (p *Peer) SendBadCRC(ulpdu []byte) error {
	f := mpa.AppendFPDU(nil, ulpdu, nil, true)
	f[len(f)-1] ^= 0xFF
	return p.SendRaw(f)
}

// SendRaw writes bytes as they are.
func (p *Peer) SendRaw(b []byte) error {
	p.Conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := p.Conn.Write(b)
	if err != nil {
		return fmt.Errorf("rawpeer: write: %w", err)
	}
	return nil
}

// ReadULPDU reads the next FPDU and returns its ULPDU.
func (p *Peer) ReadULPDU(timeout time.Duration) ([]byte, error) {
	p.Conn.SetReadDeadline(time.Now().Add(timeout))
	defer p.Conn.SetReadDeadline(time.Time{})
	n, err := p.rd.Next()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if err := p.rd.ReadFull(b); err != nil {
		return nil, err
	}
	if err := p.rd.Finish(); err != nil {
		return nil, err
	}
	return b, nil
}

// ErrNoTerminate is returned when the stream ends without a Terminate.
var ErrNoTerminate = errors.New("rawpeer: stream ended without a Terminate")

// Terminate is a received Terminate message with its DDP header fields.
type Terminate struct {
	rdmap.TerminateFields
	MSN uint32
	Raw []byte // the whole ULPDU
}

// ReadTerminate reads FPDUs until a Terminate arrives and returns it,
// together with the ULPDUs seen before it.
func (p *Peer) ReadTerminate(timeout time.Duration) (*Terminate, [][]byte, error) {
	deadline := time.Now().Add(timeout)
	var before [][]byte
	for {
		u, err := p.ReadULPDU(time.Until(deadline))
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, before, ErrNoTerminate
			}
			return nil, before, err
		}
		if ddp.IsTagged(u[0]) || len(u) < ddp.UntaggedHeaderLen {
			before = append(before, u)
			continue
		}
		h := ddp.Untagged(u[:ddp.UntaggedHeaderLen])
		op, err := rdmap.ParseCtrl(h.RsvdULP0())
		if err != nil || op != rdmap.OpTerminate || h.QN() != rdmap.QNTerminate {
			before = append(before, u)
			continue
		}
		f, err := rdmap.ParseTerminate(u[ddp.UntaggedHeaderLen:])
		if err != nil {
			return nil, before, fmt.Errorf("rawpeer: bad Terminate %x: %w", u, err)
		}
		return &Terminate{TerminateFields: f, MSN: h.MSN(), Raw: u}, before, nil
	}
}

// WaitClosed reads until the other side closes (EOF) and reports whether it
// did within timeout. Bytes that arrive are discarded.
func (p *Peer) WaitClosed(timeout time.Duration) error {
	p.Conn.SetReadDeadline(time.Now().Add(timeout))
	defer p.Conn.SetReadDeadline(time.Time{})
	_, err := io.Copy(io.Discard, p.Conn)
	if err != nil {
		return fmt.Errorf("rawpeer: waiting for close: %w", err)
	}
	return nil
}

// Close closes the connection.
func (p *Peer) Close() error { return p.Conn.Close() }
