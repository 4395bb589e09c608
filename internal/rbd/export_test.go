//go:build ceph

package rbd

// SyncReadAt and SyncWriteAt are go-ceph's synchronous calls (rbd_read,
// rbd_write), which the Image methods replaced with aio: BenchmarkQueueDepth
// compares the two.
func (im *Image) SyncReadAt(p []byte, off int64) error {
	_, err := im.img.ReadAt(p, off)
	return wrap("read", im.where, err)
}

func (im *Image) SyncWriteAt(p []byte, off int64) error {
	_, err := im.img.WriteAt(p, off)
	return wrap("write", im.where, err)
}
