package nbd

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/pojntfx/go-nbd/pkg/protocol"

	"github.com/rnic-dev/rnic/internal/sockio"
)

// replyWriter sends a connection's replies in the order they complete.
// Whoever completes requests queues their replies and calls Flush: the
// first caller writes everything queued, the header and the data of each
// reply gathered in one writev, without waiting: the goroutine that saw a
// burst of completions (an AsyncBackend's completion handler) sends its
// replies itself, with no hand-off. Callers arriving while a write is under
// way only queue: the writer picks their replies up before it stops. A
// write the socket does not take whole (a client slow to read) is finished
// by the connection's writer goroutine, which blocks in its stead; until it
// has caught up, it sends whatever is queued meanwhile.
type replyWriter struct {
	t   *transmission
	raw syscall.RawConn // nil: the connection offers none; every write goes through the goroutine

	mu       sync.Mutex
	queue    []*request
	spare    []*request
	flushing bool  // a Flush or the goroutine is writing
	err      error // the first write error: later replies are dropped
	closed   bool

	// Of the batch being written (by one writer at a time).
	batch []*request
	bufs  net.Buffers // what is left to write of the batch
	arr   net.Buffers // bufs' array (writing consumes bufs from the front)
	iov   []syscall.Iovec
	wn    uintptr
	werrn syscall.Errno
	write func(fd uintptr) bool

	wake chan struct{} // the goroutine has a partly written batch to finish
	quit chan struct{} // closed by close: the goroutine ends
	gone chan struct{} // closed when the goroutine ended
}

// maxIov bounds the buffers of one writev (IOV_MAX is 1024).
const maxIov = 1024

func (w *replyWriter) init(t *transmission) {
	w.t = t
	if sc, ok := t.c.nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
		}
	}
	w.iov = make([]syscall.Iovec, 0, maxIov)
	w.write = w.writev
	w.wake = make(chan struct{}, 1)
	w.quit = make(chan struct{})
	w.gone = make(chan struct{})
	go w.run()
}

// add queues r's reply.
func (w *replyWriter) add(r *request) {
	r.encodeReply(w.t.sel.structured)
	w.mu.Lock()
	w.queue = append(w.queue, r)
	w.mu.Unlock()
}

// encodeReply encodes r's reply header into r.hdr: a simple reply, or
// with structured replies negotiated for READ and BLOCK_STATUS the one
// chunk (NBD_REPLY_FLAG_DONE) of their reply: the data at the request's
// offset, the descriptors of base:allocation, or the error.
func (r *request) encodeReply(structured bool) {
	if !structured || (r.typ != CmdRead && r.typ != CmdBlockStatus) {
		SimpleReply(r.hdr[:]).Encode(protocol.TransmissionReplyHeader{ReplyMagic: magicSimpleReply, Error: r.errno,
			Handle: r.cookie})
		r.hdrLen = SimpleReplySize
		return
	}
	h := StructuredReply(r.hdr[:])
	f := StructuredReplyFields{Flags: ReplyFlagDone, Cookie: r.cookie}
	p := r.hdr[StructuredReplySize:]
	switch {
	case r.errno != 0:
		// Error, then a message length of 0.
		f.Type, f.Length = ReplyTypeError, 6
		binary.BigEndian.PutUint32(p, r.errno)
		binary.BigEndian.PutUint16(p[4:], 0)
	case r.typ == CmdRead && r.length == 0:
		f.Type = ReplyTypeNone
	case r.typ == CmdRead:
		f.Type, f.Length = ReplyTypeOffsetData, 8+r.length
		binary.BigEndian.PutUint64(p, r.off)
	default:
		f.Type, f.Length = ReplyTypeBlockStatus, 4+uint32(len(r.ext))
		binary.BigEndian.PutUint32(p, metaAllocID)
	}
	h.Encode(f)
	r.hdrLen = StructuredReplySize + int(f.Length) - payloadAfterHeader(r)
}

// payloadAfterHeader is the part of a structured chunk's payload that
// follows r.hdr: the data of a READ, the descriptors of a BLOCK_STATUS.
func payloadAfterHeader(r *request) int {
	switch {
	case r.errno != 0:
		return 0
	case r.typ == CmdRead:
		return int(r.length)
	}
	return len(r.ext)
}

// Flush writes the queued replies unless a write is under way (it then
// picks them up).
func (w *replyWriter) Flush() {
	w.mu.Lock()
	if w.flushing {
		w.mu.Unlock()
		return
	}
	w.flushing = true
	for w.take() {
		w.mu.Unlock()
		if !w.writeNow() {
			// The socket is full: the goroutine finishes this batch and
			// keeps flushing set until it has sent everything.
			w.wake <- struct{}{}
			return
		}
		w.release()
		w.mu.Lock()
	}
	w.flushing = false
	w.mu.Unlock()
}

// take moves the queue to the batch (w.mu held); false if it is empty.
func (w *replyWriter) take() bool {
	if len(w.queue) == 0 {
		return false
	}
	w.batch, w.queue, w.spare = w.queue, w.spare[:0], nil
	w.bufs = w.arr[:0]
	for _, r := range w.batch {
		if w.err != nil {
			continue
		}
		w.bufs = append(w.bufs, r.hdr[:r.hdrLen])
		switch {
		case r.errno != 0:
		case r.typ == CmdRead && r.buf != nil:
			w.bufs = append(w.bufs, *r.buf)
		case r.typ == CmdBlockStatus:
			w.bufs = append(w.bufs, r.ext)
		}
	}
	w.arr = w.bufs[:0]
	return true
}

// writeNow writes as much of the batch as the socket takes without
// waiting; it reports whether all of it went (or the connection failed).
func (w *replyWriter) writeNow() bool {
	if w.raw == nil {
		return len(w.bufs) == 0
	}
	for len(w.bufs) > 0 {
		w.iov = w.iov[:0]
		for _, b := range w.bufs {
			if len(w.iov) == maxIov {
				break
			}
			if len(b) > 0 {
				w.iov = append(w.iov, syscall.Iovec{Base: &b[0]})
				w.iov[len(w.iov)-1].SetLen(len(b))
			}
		}
		if err := w.raw.Write(w.write); err != nil {
			w.fail(err)
			return true
		}
		switch w.werrn {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			w.fail(w.werrn)
			return true
		}
		w.consume(int64(w.wn))
	}
	return true
}

// writev is the raw write: one non-blocking writev of w.iov.
func (w *replyWriter) writev(fd uintptr) bool {
	w.wn, w.werrn = 0, 0
	if len(w.iov) == 0 {
		return true
	}
	n, e := sockio.Writev(fd, w.iov)
	w.wn, w.werrn = uintptr(n), e
	return true
}

// consume drops n written bytes from the front of w.bufs.
func (w *replyWriter) consume(n int64) {
	for len(w.bufs) > 0 {
		if l := int64(len(w.bufs[0])); n < l {
			w.bufs[0] = w.bufs[0][n:]
			return
		} else {
			n -= l
		}
		w.bufs[0] = nil
		w.bufs = w.bufs[1:]
	}
}

// fail records a write error and closes the connection, which stops the
// reader; replies still queued are released unsent.
func (w *replyWriter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = fmt.Errorf("nbd: send reply: %w", err)
		w.t.c.nc.Close()
	}
	w.mu.Unlock()
	w.bufs = w.bufs[:0]
}

// release ends the requests of the written batch and recycles the batch.
func (w *replyWriter) release() {
	for i, r := range w.batch {
		w.t.done(r)
		w.t.wg.Done()
		w.batch[i] = nil
	}
	w.mu.Lock()
	if w.spare == nil {
		w.spare = w.batch[:0]
	}
	w.batch = nil
	w.mu.Unlock()
}

// run finishes batches the socket did not take at once, blocking, and
// then what was queued meanwhile, until the queue is empty.
func (w *replyWriter) run() {
	defer close(w.gone)
	for {
		select {
		case <-w.wake:
		case <-w.quit:
			return
		}
		for {
			if len(w.bufs) > 0 {
				if _, err := w.bufs.WriteTo(w.t.c.nc); err != nil {
					w.fail(err)
				}
			}
			w.release()
			w.mu.Lock()
			if !w.take() {
				w.flushing = false
				w.mu.Unlock()
				break
			}
			w.mu.Unlock()
		}
	}
}

// close stops the goroutine once every reply was written (the caller has
// waited for all requests) and returns the first write error.
func (w *replyWriter) close() error {
	close(w.quit)
	<-w.gone
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return w.err
}
