package wiretest

import (
	"encoding/binary"
	"os"
	"testing"
)

// pcapFile accumulates a classic pcap capture with Ethernet link type.
type pcapFile struct {
	buf  []byte
	usec uint32
}

func newPcap() *pcapFile {
	p := &pcapFile{}
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 0xa1b2c3d4) // magic, microseconds
	p.buf = binary.LittleEndian.AppendUint16(p.buf, 2)
	p.buf = binary.LittleEndian.AppendUint16(p.buf, 4)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 0) // thiszone
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 0) // sigfigs
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 262144)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 1) // LINKTYPE_ETHERNET
	return p
}

func (p *pcapFile) packet(frame []byte) {
	p.usec += 100
	p.buf = binary.LittleEndian.AppendUint32(p.buf, 1700000000+p.usec/1000000)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, p.usec%1000000)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(frame)))
	p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(frame)))
	p.buf = append(p.buf, frame...)
}

func (p *pcapFile) write(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, p.buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpPSH = 0x08
	tcpACK = 0x10
)

// endpoint is one side of a TCP connection.
type endpoint struct {
	ip   [4]byte
	port uint16
	mac  [6]byte
	seq  uint32 // next sequence number to send
}

// tcpConn writes one TCP connection's packets, with correct sequence and
// acknowledgment numbers and valid IPv4 and TCP checksums.
type tcpConn struct {
	p    *pcapFile
	ends [2]endpoint // 0: initiator (client), 1: responder (server)
	ipID uint16
}

func newConn(p *pcapFile, cport, sport uint16, iss0, iss1 uint32) *tcpConn {
	return &tcpConn{p: p, ends: [2]endpoint{
		{ip: [4]byte{127, 0, 0, 1}, port: cport, mac: [6]byte{2, 0, 0, 0, 0, 1}, seq: iss0},
		{ip: [4]byte{127, 0, 0, 2}, port: sport, mac: [6]byte{2, 0, 0, 0, 0, 2}, seq: iss1},
	}}
}

func checksum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// segment writes one TCP segment from side with the given flags and payload.
func (c *tcpConn) segment(side int, flags byte, payload []byte) {
	src, dst := &c.ends[side], &c.ends[1-side]
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:], src.port)
	binary.BigEndian.PutUint16(tcp[2:], dst.port)
	binary.BigEndian.PutUint32(tcp[4:], src.seq)
	if flags&tcpACK != 0 {
		binary.BigEndian.PutUint32(tcp[8:], dst.seq)
	}
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	tcp = append(tcp, payload...)
	pseudo := make([]byte, 0, 12)
	pseudo = append(pseudo, src.ip[:]...)
	pseudo = append(pseudo, dst.ip[:]...)
	pseudo = append(pseudo, 0, 6)
	pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], fold(checksum(checksum(0, pseudo), tcp)))

	ip := make([]byte, 20, 20+len(tcp))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
	c.ipID++
	binary.BigEndian.PutUint16(ip[4:], c.ipID)
	ip[6] = 0x40 // DF
	ip[8] = 64
	ip[9] = 6
	copy(ip[12:], src.ip[:])
	copy(ip[16:], dst.ip[:])
	binary.BigEndian.PutUint16(ip[10:], fold(checksum(0, ip)))
	ip = append(ip, tcp...)

	eth := make([]byte, 14, 14+len(ip))
	copy(eth[0:], dst.mac[:])
	copy(eth[6:], src.mac[:])
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	c.p.packet(append(eth, ip...))

	src.seq += uint32(len(payload))
	if flags&(tcpSYN|tcpFIN) != 0 {
		src.seq++
	}
}

func (c *tcpConn) handshake() {
	c.segment(0, tcpSYN, nil)
	c.segment(1, tcpSYN|tcpACK, nil)
	c.segment(0, tcpACK, nil)
}

// send writes a data segment from side and the peer's ACK of it.
func (c *tcpConn) send(side int, payload []byte) {
	c.segment(side, tcpPSH|tcpACK, payload)
	c.segment(1-side, tcpACK, nil)
}

// close does a graceful close started by side.
func (c *tcpConn) close(side int) {
	c.segment(side, tcpFIN|tcpACK, nil)
	c.segment(1-side, tcpFIN|tcpACK, nil)
	c.segment(side, tcpACK, nil)
}
