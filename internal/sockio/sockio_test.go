package sockio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a TCP connection on loopback.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	return p
}

// rawWrite writes all of p to c with Write (or with Writev of two halves),
// waiting through the poller when the socket is full.
func rawWrite(c *net.TCPConn, p []byte, vec bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for len(p) > 0 {
		var n int
		var e syscall.Errno
		werr := raw.Write(func(fd uintptr) bool {
			if vec {
				h := len(p) / 2
				iov := []syscall.Iovec{{Base: &p[0]}, {Base: &p[h]}}
				iov[0].SetLen(h)
				iov[1].SetLen(len(p) - h)
				if h == 0 {
					iov = iov[1:]
				}
				n, e = Writev(fd, iov)
			} else {
				n, e = Write(fd, p)
			}
			return e != syscall.EAGAIN
		})
		if werr != nil {
			return werr
		}
		if e != 0 {
			return fmt.Errorf("write: %w", e)
		}
		p = p[n:]
	}
	return nil
}

// TestWriteRead: Write and Writev, small and large, and
// Reader at the other end see the same bytes; the sender's close is EOF.
func TestWriteRead(t *testing.T) {
	for _, size := range []int{1, 4096, 16 << 10, 16<<10 + 1, 1 << 20} {
		for _, vec := range []bool{false, true} {
			a, b := pair(t)
			want := pattern(size)
			werr := make(chan error, 1)
			go func() {
				werr <- rawWrite(a, want, vec)
				a.CloseWrite()
			}()
			got, err := io.ReadAll(NewReader(b))
			if err != nil {
				t.Fatalf("size %d, writev %v: %v", size, vec, err)
			}
			if err := <-werr; err != nil {
				t.Fatalf("size %d, writev %v: %v", size, vec, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("size %d, writev %v: read %d bytes, not what was written", size, vec, len(got))
			}
		}
	}
}

// TestReadVec: Reader.ReadVec fills its two buffers in order, and the
// end of the stream is io.EOF.
func TestReadVec(t *testing.T) {
	a, b := pair(t)
	want := pattern(30000)
	if _, err := a.Write(want); err != nil {
		t.Fatal(err)
	}
	a.CloseWrite()
	r := NewReader(b)
	var got []byte
	for {
		x, y := make([]byte, 1000), make([]byte, 5000)
		n, err := r.ReadVec(x, y)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, append(x, y...)[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("readv returned %d bytes, not those written", len(got))
	}
}

// TestReaderDeadlineAndClose: a Reader waiting for data honours the
// connection's read deadline and returns when the connection is closed,
// with the errors net.Conn.Read gives.
func TestReaderDeadlineAndClose(t *testing.T) {
	_, b := pair(t)
	r := NewReader(b)
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want %v", err, os.ErrDeadlineExceeded)
	}
	b.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 10))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read of a closed connection: %v, want %v", err, net.ErrClosed)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not end a read in progress")
	}
}

// TestReaderNoAllocs: a read costs no allocation.
func TestReaderNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, b := pair(t)
	r := NewReader(b)
	buf := make([]byte, 64)
	msg := pattern(64)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if err := r.WaitReadable(); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatal(err)
		}
		if n, err := r.TryReadVec(buf, buf); n != 0 || !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("TryReadVec of an empty socket: %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write, wait and read, want 0", allocs)
	}
}

// TestTryRead: TryReadVec returns EAGAIN at once on an empty socket, what
// is there otherwise, and leaves the Reader waiting as before.
func TestTryRead(t *testing.T) {
	a, b := pair(t)
	r := NewReader(b)
	buf := make([]byte, 64)
	start := time.Now()
	if n, err := r.TryReadVec(buf, nil); n != 0 || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("TryReadVec of an empty socket: %d, %v; want EAGAIN", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("TryReadVec waited %v", d)
	}
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	var n int
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if n, err = r.TryReadVec(buf, nil); !errors.Is(err, syscall.EAGAIN) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("TryReadVec with data there: %q, %v", buf[:n], err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Read(buf)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Read after TryReadVec returned without data: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	a.Write([]byte("x"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if _, err = r.TryReadVec(buf, nil); !errors.Is(err, syscall.EAGAIN) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != io.EOF {
		t.Fatalf("TryReadVec at the end of the stream: %v, want EOF", err)
	}
}

// TestWaitReadable: WaitReadable waits for bytes without consuming them
// (also for bytes that came before it was called), honours the read
// deadline, and returns at the end of the stream; TryReadVec fills both
// buffers from what is there.
func TestWaitReadable(t *testing.T) {
	a, b := pair(t)
	r := NewReader(b)
	b.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if err := r.WaitReadable(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitReadable on an empty socket: %v, want the deadline", err)
	}
	b.SetReadDeadline(time.Time{})
	// Bytes that arrive while it waits.
	done := make(chan error, 1)
	go func() { done <- r.WaitReadable() }()
	if _, err := a.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Bytes already there: at once, and again, since it consumes none.
	for range 2 {
		if err := r.WaitReadable(); err != nil {
			t.Fatal(err)
		}
	}
	x, y := make([]byte, 4), make([]byte, 16)
	var n int
	var err error
	for got := 0; got < 10; got += n {
		if n, err = r.TryReadVec(x[min(got, 4):], y[max(got-4, 0):]); err != nil {
			t.Fatalf("TryReadVec after %d bytes: %v", got, err)
		}
	}
	if string(x)+string(y[:6]) != "0123456789" {
		t.Fatalf("TryReadVec read %q %q", x, y)
	}
	if n, err := r.TryReadVec(x, y); n != 0 || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("TryReadVec of an empty socket: %d, %v; want EAGAIN", n, err)
	}
	a.Close()
	if err := r.WaitReadable(); err != nil {
		t.Fatalf("WaitReadable at the end of the stream: %v", err)
	}
	if _, err := r.TryReadVec(x, y); err != io.EOF {
		t.Fatalf("TryReadVec at the end of the stream: %v, want EOF", err)
	}
	// A reset: WaitReadable returns, and leaves the error to the read.
	a, b = pair(t)
	r = NewReader(b)
	a.SetLinger(0)
	a.Close()
	if err := r.WaitReadable(); err != nil {
		t.Fatalf("WaitReadable after a reset: %v", err)
	}
	if _, err := r.TryReadVec(x, y); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("TryReadVec after a reset: %v, want ECONNRESET", err)
	}
}
