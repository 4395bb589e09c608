package nbd

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan *net.TCPConn, 1)
	go func() {
		c, _ := ln.AcceptTCP()
		acc <- c
	}()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestFillNowKeepsSocketError: a fill without waiting that meets the
// socket's error (here a reset) leaves it for the reads that follow. The
// bufio.Reader hands a fill's error out once, to the Peek that fillNow
// ignores, so without sockSource keeping it the reader would see a
// clean end of stream instead of the reset.
func TestFillNowKeepsSocketError(t *testing.T) {
	client, server := tcpPair(t)
	src := connReader(server)
	if _, ok := src.(*sockSource); !ok {
		t.Fatalf("connReader of a TCP connection is %T, want *sockSource", src)
	}
	c := &conn{nc: server, src: src, br: bufio.NewReaderSize(src, ioBufSize)}

	// Nothing sent yet: the fill finds nothing and does not wait.
	if c.fillNow(RequestSize) {
		t.Fatal("fillNow reported a request on an idle socket")
	}
	if _, err := client.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := client.SetLinger(0); err != nil { // close sends a reset
		t.Fatal(err)
	}
	client.Close()
	// Wait (as the reader would) until the reset has arrived, then let
	// the fill without waiting take the 10 bytes and meet it.
	if err := src.(*sockSource).r.WaitReadable(); err != nil {
		t.Fatal(err)
	}
	for c.br.Buffered() < 10 {
		if c.fillNow(RequestSize) {
			t.Fatal("fillNow reported a whole request; 10 bytes were sent")
		}
	}
	if c.fillNow(RequestSize) {
		t.Fatal("fillNow reported a whole request after the reset")
	}
	var hdr [RequestSize]byte
	n, err := io.ReadFull(c.br, hdr[:])
	if n != 10 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("ReadFull after the reset: %d bytes, %v; want 10 bytes and ECONNRESET", n, err)
	}
}
