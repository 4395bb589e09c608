//go:build ceph

package rbd

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// idObject is the RADOS object (in the pool's namespace) holding the last
// volume ID handed out; idLock is the advisory lock serialising the
// read-increment-write of it.
const (
	idObject = "rtarget_volume_ids"
	idLock   = "alloc"
)

// NextID hands out a volume ID unique within the pool (namespace) and never
// reused: a counter in a RADOS object, incremented under a RADOS advisory
// lock so that concurrent allocators (several gateways, the volume
// commands) never hand out the same one.
func (p *Pool) NextID() (uint32, error) {
	var c [8]byte
	rand.Read(c[:])
	cookie := hex.EncodeToString(c[:])
	deadline := time.Now().Add(p.conn.timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		ret, err := p.ioctx.LockExclusive(idObject, idLock, cookie, "rtarget volume id allocation", 30*time.Second, nil)
		if err == nil && ret == 0 {
			break
		}
		if err == nil {
			err = errnoErr("id lock", p.spec, ret)
		} else {
			err = wrap("id lock", p.spec, err)
		}
		if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EEXIST) || time.Now().After(deadline) {
			return 0, err
		}
		time.Sleep(wait)
	}
	defer p.ioctx.Unlock(idObject, idLock, cookie)
	var buf [8]byte
	n, err := p.ioctx.Read(idObject, buf[:], 0)
	if err != nil && !errors.Is(wrap("", "", err), ErrNotFound) {
		return 0, wrap("id read", p.spec, err)
	}
	var last uint64
	if n == 8 {
		last = binary.BigEndian.Uint64(buf[:])
	}
	if last >= 1<<32-1 {
		return 0, fmt.Errorf("rbd %s: volume IDs exhausted", p.spec)
	}
	binary.BigEndian.PutUint64(buf[:], last+1)
	if err := p.ioctx.WriteFull(idObject, buf[:]); err != nil {
		return 0, wrap("id write", p.spec, err)
	}
	return uint32(last + 1), nil
}
