package perftest

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// handshake is a client's struct pingpong_dest as perftest sends it.
func handshake(outReads, qpn, psn, rkey uint32, vaddr uint64) []byte {
	b := make([]byte, destLen)
	binary.BigEndian.PutUint32(b[4:], outReads)
	binary.BigEndian.PutUint32(b[8:], qpn)
	binary.BigEndian.PutUint32(b[12:], psn)
	binary.BigEndian.PutUint32(b[16:], rkey)
	binary.BigEndian.PutUint64(b[24:], vaddr)
	return b
}

var ours = destFields{OutReads: 16, QPN: 2, PSN: 0x1000, RKey: 0x1234_5678, VAddr: bufVA}

func TestCommAnswerHandshake(t *testing.T) {
	reply := make([]byte, commBufLen)
	size, peer, err := commAnswer(handshake(8, 7, 9, 0xabcd, 0x7f00_0000_1000), reply, ours)
	if err != nil || size != destLen {
		t.Fatalf("commAnswer = %d, %v; want %d, nil", size, err, destLen)
	}
	want := destFields{OutReads: 8, RKey: 0xabcd, VAddr: 0x7f00_0000_1000}
	if peer == nil || *peer != want {
		t.Fatalf("peer %+v, want %+v", peer, want)
	}
	d := dest(reply)
	if d.OutReads() != ours.OutReads || d.RKey() != ours.RKey || d.VAddr() != ours.VAddr ||
		binary.BigEndian.Uint32(d[8:]) != ours.QPN || binary.BigEndian.Uint32(d[12:]) != ours.PSN {
		t.Fatalf("answer %x does not carry %+v", reply[:destLen], ours)
	}
	// A handshake naming no buffer (the first one of ib_send_bw's client)
	// leaves the peer as it was.
	if _, peer, err := commAnswer(handshake(8, 7, 9, 0, 0), reply, ours); err != nil || peer != nil {
		t.Fatalf("bufferless handshake: peer %+v, err %v", peer, err)
	}
}

func TestCommAnswerEchoAndTooLong(t *testing.T) {
	reply := make([]byte, commBufLen)
	msg := []byte("sync barrier")
	if size, peer, err := commAnswer(msg, reply, ours); err != nil || size != len(msg) || peer != nil ||
		!bytes.Equal(reply[:size], msg) {
		t.Fatalf("echo: %d %+v %v %q", size, peer, err, reply[:len(msg)])
	}
	if _, _, err := commAnswer(make([]byte, commBufLen+1), reply, ours); err == nil {
		t.Fatal("a message longer than the answer buffer was accepted")
	}
}

// FuzzCommAnswer feeds commAnswer what a client may send on the comm
// connection: it never panics, never writes past the answer buffer, and
// answers a handshake with ours and anything else that fits with itself.
func FuzzCommAnswer(f *testing.F) {
	f.Add(handshake(8, 7, 9, 0xabcd, 0x7f00_0000_1000))
	f.Add(handshake(0, 0, 0, 0, 0))
	f.Add([]byte("sync"))
	f.Add([]byte{})
	f.Add(make([]byte, commBufLen))
	f.Fuzz(func(t *testing.T, msg []byte) {
		buf := make([]byte, commBufLen+16)
		for i := range buf {
			buf[i] = 0xa5
		}
		reply := buf[:commBufLen]
		size, peer, err := commAnswer(msg, reply, ours)
		for _, c := range buf[commBufLen:] {
			if c != 0xa5 {
				t.Fatal("wrote past the answer buffer")
			}
		}
		switch {
		case len(msg) > commBufLen:
			if err == nil {
				t.Fatalf("%d-byte message accepted", len(msg))
			}
		case err != nil:
			t.Fatalf("%d-byte message: %v", len(msg), err)
		case size != len(msg):
			t.Fatalf("answer of %d bytes to %d", size, len(msg))
		case len(msg) == destLen:
			d := dest(reply)
			if d.RKey() != ours.RKey || d.VAddr() != ours.VAddr {
				t.Fatalf("handshake answered with %x", reply[:destLen])
			}
			m := dest(msg)
			if (peer != nil) != (m.RKey() != 0 || m.VAddr() != 0) ||
				peer != nil && (peer.RKey != m.RKey() || peer.VAddr != m.VAddr() || peer.OutReads != m.OutReads()) {
				t.Fatalf("peer %+v from %x", peer, msg)
			}
		default:
			if peer != nil || !bytes.Equal(reply[:size], msg) {
				t.Fatalf("echo %x of %x, peer %+v", reply[:size], msg, peer)
			}
		}
	})
}
