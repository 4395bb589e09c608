package sockio

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Reader reads a connection through its syscall.RawConn with Read and
// Readv: waits go through the network poller and honour the connection's
// read deadline, as net.Conn.Read's do.
type Reader struct {
	raw   syscall.RawConn
	p     []byte           // the buffer of a read into one
	iov   [2]syscall.Iovec // the buffers of a read into two
	cnt   int              // buffers in iov; 0: read into p
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool // made once: a closure per read would allocate
	// nowait: a read that finds nothing returns EAGAIN (TryReadVec).
	nowait bool
}

// errAgain is what a read without waiting returns when nothing is there.
// It is made once: the receive meets it on its data path (TryReadVec, each
// time a segment's payload must be waited for), which allocates nothing.
var errAgain error = os.NewSyscallError("read", syscall.EAGAIN)

// NewReader returns a Reader of nc, or nil when nc offers no
// syscall.RawConn.
func NewReader(nc net.Conn) *Reader {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &Reader{raw: raw}
	r.fn = func(fd uintptr) bool {
		for {
			var n int
			var e syscall.Errno
			if r.cnt == 0 {
				n, e = Read(fd, r.p)
			} else {
				n, e = Readv(fd, r.iov[:r.cnt])
			}
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				if r.nowait {
					r.n, r.errno = 0, e
					return true
				}
				return false // wait until readable
			}
			r.n, r.errno = n, e
			return true
		}
	}
	return r
}

// Read reads what is there, at least one byte, or returns io.EOF at the
// end of the stream.
func (r *Reader) Read(p []byte) (int, error) { return r.ReadVec(p, nil) }

// TryReadVec is ReadVec without waiting: when nothing is there it returns
// an error that is syscall.EAGAIN (errors.Is).
func (r *Reader) TryReadVec(a, b []byte) (int, error) {
	r.nowait = true
	n, err := r.ReadVec(a, b)
	r.nowait = false
	return n, err
}

// WaitReadable waits until a read would not wait: bytes are there, or the
// stream ended, or the socket failed. It reads nothing. Like a read, it
// honours the read deadline (os.ErrDeadlineExceeded) and ends when the
// connection is closed.
//
// The readiness the network poller saw before the call is dropped as the
// wait begins, so WaitReadable looks at the socket first (Ready), and
// waits only if nothing is there.
func (r *Reader) WaitReadable() error { return r.raw.Read(Ready) }

// ReadVec reads into a, then b, in one system call: what is there, at
// least one byte, or io.EOF at the end of the stream.
func (r *Reader) ReadVec(a, b []byte) (int, error) {
	if len(a) == 0 {
		if len(b) == 0 {
			return 0, nil
		}
		a, b = b, nil
	}
	if len(b) == 0 {
		r.p, r.cnt = a, 0
	} else {
		r.iov[0].Base = &a[0]
		r.iov[0].SetLen(len(a))
		r.iov[1].Base = &b[0]
		r.iov[1].SetLen(len(b))
		r.cnt = 2
	}
	err := r.raw.Read(r.fn)
	r.p, r.iov = nil, [2]syscall.Iovec{} // hold no memory between reads
	switch {
	case err != nil:
		return 0, err
	case r.errno == syscall.EAGAIN:
		return 0, errAgain
	case r.errno != 0:
		return 0, os.NewSyscallError("read", r.errno)
	case r.n == 0:
		return 0, io.EOF
	}
	raceWrite(a[:min(r.n, len(a))])
	if r.n > len(a) {
		raceWrite(b[:r.n-len(a)])
	}
	return r.n, nil
}
