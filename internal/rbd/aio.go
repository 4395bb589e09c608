//go:build ceph

package rbd

/*
#cgo LDFLAGS: -lrbd
#include <stdint.h>
#include <stdlib.h>
#include <rbd/librbd.h>

extern void rnicRBDAioDone(uintptr_t tag, ssize_t ret);

static void rnic_aio_cb(rbd_completion_t c, void *arg) {
	ssize_t r = rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	rnicRBDAioDone((uintptr_t)arg, r);
}

// rnic_aio submits one asynchronous operation; op: 0 read, 1 write,
// 2 discard, 3 flush. The callback runs on a librbd thread.
static int rnic_aio(rbd_image_t img, int op, uint64_t off, size_t len, char *buf, uintptr_t tag) {
	rbd_completion_t c;
	int r = rbd_aio_create_completion((void *)tag, rnic_aio_cb, &c);
	if (r < 0)
		return r;
	switch (op) {
	case 0: r = rbd_aio_read(img, off, len, buf, c); break;
	case 1: r = rbd_aio_write(img, off, len, buf, c); break;
	case 2: r = rbd_aio_discard(img, off, len, c); break;
	default: r = rbd_aio_flush(img, c); break;
	}
	if (r < 0)
		rbd_aio_release(c);
	return r;
}

static int rnic_open(void *ioctx, const char *name, rbd_image_t *img) {
	return rbd_open((rados_ioctx_t)ioctx, name, img, NULL);
}
*/
import "C"

import (
	"fmt"
	"reflect"
	"runtime"
	"runtime/cgo"
	"unsafe"
)

// rawHandle returns librbd's handle of an image go-ceph opened (the
// unexported field image of go-ceph v0.34.0's rbd.Image, an rbd_image_t),
// so that asynchronous requests go through the handle that owns the
// image's exclusive lock.
func rawHandle(img any) C.rbd_image_t {
	f := reflect.ValueOf(img).Elem().FieldByName("image")
	return *(*C.rbd_image_t)(unsafe.Pointer(f.UnsafeAddr()))
}

// aio runs one asynchronous request on the image's own handle and waits
// for it: the calling goroutine parks on a channel instead of blocking an
// OS thread in a cgo call for the request's whole round trip (which makes
// the Go scheduler hand its P to another thread every time).
func (im *Image) aio(op int, p []byte, off, n uint64) (int, error) {
	a := AioImage{img: rawHandle(im.img), where: im.where}
	done, err := a.submit(op, p, off, n)
	if err != nil {
		return 0, err
	}
	ret := <-done
	if ret < 0 {
		return 0, errnoErr(aioNames[op], im.where, ret)
	}
	return ret, nil
}

var aioNames = [...]string{"read", "write", "discard", "flush"}

// AioImage is an image opened for librbd's asynchronous I/O (rbd_aio_*),
// which go-ceph does not wrap: a request is submitted from the calling
// goroutine and completes through a callback on a librbd thread, so many
// requests are in flight without a blocked OS thread each. It exists to
// measure that path against synchronous calls from goroutines (see
// BenchmarkQueueDepth).
type AioImage struct {
	img   C.rbd_image_t
	where string
}

// OpenAio opens an image for asynchronous I/O.
func (p *Pool) OpenAio(name string) (*AioImage, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var img C.rbd_image_t
	if ret := C.rnic_open(p.ioctx.Pointer(), cname, &img); ret < 0 {
		return nil, errnoErr("open", p.where(name), int(ret))
	}
	return &AioImage{img: img, where: p.where(name)}, nil
}

// Close closes the image; no request may be in flight.
func (a *AioImage) Close() error {
	return errnoErr("close", a.where, int(C.rbd_close(a.img)))
}

// aioOp is one request in flight: the buffer stays pinned until the
// callback delivers the result on done.
type aioOp struct {
	pin  runtime.Pinner
	done chan int
}

//export rnicRBDAioDone
func rnicRBDAioDone(tag C.uintptr_t, ret C.ssize_t) {
	h := cgo.Handle(tag)
	op := h.Value().(*aioOp)
	h.Delete()
	op.pin.Unpin()
	op.done <- int(ret)
}

// Submit starts a read (op 0) or write (op 1) of p at off and returns a
// channel that delivers librbd's return value (bytes or -errno).
func (a *AioImage) Submit(op int, p []byte, off uint64) (<-chan int, error) {
	return a.submit(op, p, off, uint64(len(p)))
}

// submit starts op on p (read, write) or on n bytes at off (discard).
func (a *AioImage) submit(op int, p []byte, off, n uint64) (<-chan int, error) {
	o := &aioOp{done: make(chan int, 1)}
	var buf *C.char
	if len(p) > 0 {
		o.pin.Pin(&p[0])
		buf = (*C.char)(unsafe.Pointer(&p[0]))
	}
	h := cgo.NewHandle(o)
	if ret := C.rnic_aio(a.img, C.int(op), C.uint64_t(off), C.size_t(n), buf, C.uintptr_t(h)); ret < 0 {
		h.Delete()
		o.pin.Unpin()
		return nil, errnoErr(fmt.Sprintf("aio op %d", op), a.where, int(ret))
	}
	return o.done, nil
}
