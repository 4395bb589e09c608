package store

import (
	"context"
	"fmt"
)

// thinDevice is one handle on a thin volume: the data path. An allocated
// cluster no snapshot or other volume shares is read and written in place
// with one pread or pwrite, without touching the metadata database.
type thinDevice struct{ v *thinVol }

func (d *thinDevice) blocks() uint64 { return d.v.size.Load() }

func (d *thinDevice) release() error {
	d.v.b.releaseVol(d.v)
	return nil
}

// span returns the cluster of block lba, the byte offset of lba in it and
// the bytes from there to the cluster's end, capped at n.
func (v *thinVol) span(lba uint64, n int) (c uint64, off int64, run int) {
	cb := v.b.cb
	c = lba / cb
	off = int64(lba%cb) * BlockSize
	return c, off, int(min(int64(n), v.b.cs-off))
}

// clusterRange returns the first and last cluster of n bytes at lba.
func (v *thinVol) clusterRange(lba uint64, n uint64) (uint64, uint64) {
	return lba / v.b.cb, (lba + n/BlockSize - 1) / v.b.cb
}

func (d *thinDevice) read(_ context.Context, lba uint64, dst []byte) error {
	v := d.v
	v.ioLock.RLock()
	defer v.ioLock.RUnlock()
	first, last := v.clusterRange(lba, uint64(len(dst)))
	l := v.locks.lock(first, last, false)
	defer l.unlock()
	if err := v.readLocked(lba, dst); err != nil {
		clear(dst)
		return err
	}
	return nil
}

// tryRead reads a request within one cluster when the cluster is not
// locked by a writer and its data is in the page cache (preadv2 with
// RWF_NOWAIT), or it is a hole; a clone's origin is left to read, which
// may look it up in the database.
func (d *thinDevice) tryRead(lba uint64, dst []byte) bool {
	v := d.v
	first, last := v.clusterRange(lba, uint64(len(dst)))
	if first != last || !v.ioLock.TryRLock() {
		return false
	}
	defer v.ioLock.RUnlock()
	l := &v.locks[first%numClusterLocks]
	if !l.TryRLock() {
		return false
	}
	defer l.RUnlock()
	c, off, _ := v.span(lba, len(dst))
	e := v.m.get(c)
	switch p := e.phys(); {
	case p != 0:
		return v.b.pool.tryReadAt(dst, p, off)
	case e.hole() || v.origin == nil:
		clear(dst)
		return true
	}
	return false
}

// tryWrite writes a request within one cluster that no one holds the lock
// of: in place when the cluster is allocated to this volume alone, or into
// a newly allocated cluster when nothing shows through it (cow then copies
// nothing: the rest of the new cluster is a hole), while the batch has room
// for the map change without a commit. The allocator's and the batch's
// mutexes it may wait for: they guard memory only, never I/O. A shared
// cluster or a clone's origin (a copy), or a full batch, it leaves to
// write.
func (d *thinDevice) tryWrite(lba uint64, src []byte) bool {
	v := d.v
	first, last := v.clusterRange(lba, uint64(len(src)))
	if first != last || v.b.checkFailed() != nil || !v.ioLock.TryRLock() {
		return false
	}
	defer v.ioLock.RUnlock()
	l := &v.locks[first%numClusterLocks]
	if !l.TryLock() {
		return false
	}
	defer l.Unlock()
	c, off, _ := v.span(lba, len(src))
	e := v.m.get(c)
	if p := e.phys(); p != 0 {
		return !v.shared(e) && v.b.pool.writeAt(src, p, off) == nil
	}
	if !e.hole() && v.origin != nil || v.b.batchLen() >= batchMax {
		return false
	}
	return v.cow(c, e, off, src, len(src)) == nil
}

func (v *thinVol) readLocked(lba uint64, dst []byte) error {
	b := v.b
	for len(dst) > 0 {
		c, off, n := v.span(lba, len(dst))
		e := v.m.get(c)
		if p := e.phys(); p != 0 {
			// One pread for the clusters that follow p in the same file.
			for k := uint64(1); n < len(dst); k++ {
				next := v.m.get(c + k).phys()
				if next != p+k || next>>b.pool.fileShift != p>>b.pool.fileShift {
					break
				}
				n += int(min(int64(len(dst)-n), b.cs))
			}
			if err := b.pool.readAt(dst[:n], p, off); err != nil {
				return err
			}
		} else if e.hole() || v.origin == nil {
			clear(dst[:n])
		} else {
			q, err := v.originEntry(c, false)
			if err != nil {
				return err
			}
			if q.phys() == 0 {
				clear(dst[:n])
			} else if err := b.pool.readAt(dst[:n], q.phys(), off); err != nil {
				return err
			}
		}
		dst = dst[n:]
		lba += uint64(n / BlockSize)
	}
	return nil
}

// originEntry returns what a clone's origin snapshot holds at cluster c: a
// cluster, or a hole; with wide it resolves the rest of c's window too
// (see viewEntries).
func (v *thinVol) originEntry(c uint64, wide bool) (entry, error) {
	if c >= v.b.clusters(v.origin.Size) {
		return holeEntry(0), nil
	}
	if e := v.originMap.get(c); e != 0 {
		return e, nil
	}
	return v.b.viewEntries(v.origin.ID, v.origin.Epoch, c, v.b.clusters(v.origin.Size), wide, v.originMap.set)
}

func (d *thinDevice) write(ctx context.Context, lba uint64, src []byte, fua bool) error {
	return d.v.mutate(ctx, lba, uint64(len(src)), fua, func() error { return d.v.writeLocked(lba, src) })
}

// mutate runs fn, a change of the n bytes at lba, with their clusters
// locked; then, for fua or when the batch has grown past its bound, it
// commits.
func (v *thinVol) mutate(ctx context.Context, lba, n uint64, fua bool, fn func() error) error {
	if err := v.b.checkFailed(); err != nil {
		return err
	}
	v.ioLock.RLock()
	first, last := v.clusterRange(lba, n)
	l := v.locks.lock(first, last, true)
	err := fn()
	l.unlock()
	v.ioLock.RUnlock()
	switch {
	case err != nil:
		return err
	case fua:
		return v.b.committer.Sync(ctx)
	}
	return v.afterChange(ctx)
}

func (v *thinVol) writeLocked(lba uint64, src []byte) error {
	b := v.b
	for len(src) > 0 {
		c, off, n := v.span(lba, len(src))
		e := v.m.get(c)
		if p := e.phys(); p != 0 && !v.shared(e) {
			for k := uint64(1); n < len(src); k++ {
				e2 := v.m.get(c + k)
				next := e2.phys()
				if next != p+k || v.shared(e2) || next>>b.pool.fileShift != p>>b.pool.fileShift {
					break
				}
				n += int(min(int64(len(src)-n), b.cs))
			}
			if err := b.pool.writeAt(src[:n], p, off); err != nil {
				return err
			}
		} else if whole := v.fresh(c, off, src); whole > 0 {
			if err := v.allocWhole(c, whole, src[:whole*uint64(b.cs)]); err != nil {
				return err
			}
			n = int(whole * uint64(b.cs))
		} else if err := v.cow(c, e, off, src[:n], n); err != nil {
			return err
		}
		src = src[n:]
		lba += uint64(n / BlockSize)
	}
	return nil
}

// fresh returns how many clusters from c on src covers whole (it starts
// at c's first byte: off is 0) that nothing shows through: they are
// written as they are into new clusters, several with one pwrite.
func (v *thinVol) fresh(c uint64, off int64, src []byte) uint64 {
	if off != 0 {
		return 0
	}
	n := uint64(0)
	for uint64(len(src)) >= (n+1)*uint64(v.b.cs) {
		e := v.m.get(c + n)
		if e.phys() != 0 || (!e.hole() && v.origin != nil) {
			break
		}
		n++
	}
	return n
}

// allocWhole gives the n clusters from c, which nothing shows through, new
// clusters holding src: runs of clusters that follow each other in a data
// file, each written with one pwrite.
func (v *thinVol) allocWhole(c, n uint64, src []byte) error {
	b := v.b
	for n > 0 {
		p, got, fromFree, err := b.allocRun(n)
		if err != nil {
			return err
		}
		k := got * uint64(b.cs)
		if err := b.pool.writeNew(src[:k], p, 0); err != nil {
			for i := range got {
				b.unalloc(p+i, fromFree)
			}
			return fmt.Errorf("cluster %d: %w", c, err)
		}
		for i := range got {
			v.replace(c+i, v.m.get(c+i), mkEntry(p+i, v.epoch), fromFree)
		}
		c, n, src = c+got, n-got, src[k:]
	}
	return nil
}

// cow gives cluster c a new physical cluster holding what c held with n
// bytes at off replaced by data (zeros when data is nil): the first write
// to a cluster allocates it, a write to a shared one copies it.
func (v *thinVol) cow(c uint64, e entry, off int64, data []byte, n int) error {
	b := v.b
	var base uint64 // the cluster whose content the new one starts from
	if off != 0 || int64(n) != b.cs {
		if p := e.phys(); p != 0 {
			base = p
		} else if !e.hole() && v.origin != nil {
			q, err := v.originEntry(c, false)
			if err != nil {
				return err
			}
			base = q.phys()
		}
	}
	if base == 0 && data == nil {
		return nil // zeros over what reads as zeros already
	}
	p, fromFree, err := b.alloc()
	if err != nil {
		return err
	}
	switch {
	case base != 0:
		bufp := b.bufs.Get().(*[]byte)
		buf := *bufp
		err = b.pool.readAt(buf, base, 0)
		if err == nil {
			if data == nil {
				clear(buf[off : off+int64(n)])
			} else {
				copy(buf[off:], data)
			}
			err = b.pool.writeNew(buf, p, 0)
		}
		b.bufs.Put(bufp)
	case data != nil:
		err = b.pool.writeNew(data, p, off) // the rest of a new cluster is a hole
	}
	if err != nil {
		b.unalloc(p, fromFree)
		return fmt.Errorf("cluster %d: %w", c, err)
	}
	v.replace(c, e, mkEntry(p, v.epoch), fromFree)
	return nil
}

func (d *thinDevice) discard(ctx context.Context, lba, count uint64, fua bool) error {
	return d.v.mutate(ctx, lba, count*BlockSize, fua, func() error { return d.v.discardLocked(lba, count) })
}

// discardLocked makes count blocks at lba read as zeros: whole clusters
// are unmapped (their space freed unless a snapshot holds them), parts of
// clusters are punched in place or, when shared, copied with zeros.
func (v *thinVol) discardLocked(lba, count uint64) error {
	b := v.b
	end := lba + count
	volEnd := v.size.Load()
	// Past the end of a clone's origin nothing shows through: an absent
	// entry there reads zeros as it does in a volume that is no clone, and
	// is left so (a grown clone discarded whole must not map every
	// cluster of it).
	originEnd := uint64(0)
	if v.origin != nil {
		originEnd = b.clusters(v.origin.Size)
	}
	for lba < end {
		c := lba / b.cb
		if c >= originEnd {
			// Nothing to discard in clusters never mapped.
			if next := v.m.nextMapped(c, (end-1)/b.cb+1); next > c {
				lba = max(lba, next*b.cb)
				continue
			}
		}
		off := int64(lba%b.cb) * BlockSize
		n := int64(min(end-lba, b.cb-lba%b.cb)) * BlockSize
		// A range that runs to the volume's end covers the cluster's tail
		// past it too.
		whole := off == 0 && (n == b.cs || lba+uint64(n/BlockSize) == volEnd)
		e := v.m.get(c)
		switch {
		case whole:
			if e.phys() != 0 || (c < originEnd && e.absent()) {
				v.replace(c, e, v.trimmed(), false)
			}
		case e.phys() != 0 && !v.shared(e):
			if err := b.pool.punch(e.phys(), off, n); err != nil {
				return err
			}
		default:
			if err := v.cow(c, e, off, nil, int(n)); err != nil {
				return err
			}
		}
		lba += uint64(n / BlockSize)
	}
	return nil
}

func (d *thinDevice) flush(ctx context.Context) error { return d.v.b.committer.Sync(ctx) }

func (d *thinDevice) blockStatus(ctx context.Context, lba, count uint64, fn func(Extent) bool) error {
	v := d.v
	v.ioLock.RLock()
	defer v.ioLock.RUnlock()
	r := extentRun{fn: fn}
	end := lba + count
	for lba < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := lba / v.b.cb
		if v.origin == nil {
			if next := v.m.nextMapped(c, (end-1)/v.b.cb+1); next > c {
				to := min(end, next*v.b.cb)
				if !r.add(lba, to-lba, true) {
					return nil
				}
				lba = to
				continue
			}
		}
		n := min(end-lba, v.b.cb-lba%v.b.cb)
		e := v.m.get(c)
		data := e.phys() != 0
		if !data && !e.hole() && v.origin != nil {
			q, err := v.originEntry(c, true)
			if err != nil {
				return err
			}
			data = q.phys() != 0
		}
		if !r.add(lba, n, !data) {
			return nil
		}
		lba += n
	}
	r.done()
	return nil
}
