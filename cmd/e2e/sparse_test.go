package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestSparseClients: real NBD clients see the holes of a thin volume
// through rinit (structured replies, NBD_CMD_BLOCK_STATUS with
// base:allocation, fed from the store's cluster map): nbdinfo --map lists
// them, nbdcopy and qemu-img convert skip them (their copies are sparse
// and equal the volume), and a copy reads only the data from the target.
func TestSparseClients(t *testing.T) {
	needTools(t, "nbdinfo", "nbdcopy", "qemu-io", "qemu-img")
	s := newStack(t, t.TempDir())
	u := s.uri()
	run(t, time.Minute, "qemu-io", "-f", "raw", u, "-c", "write -P 0xab 1M 1M", "-c", "write -P 0xcd 100M 64k",
		"-c", "write -P 0xef 511M 1M", "-c", "flush")

	var extents []struct {
		Offset int64 `json:"offset"`
		Length int64 `json:"length"`
		Type   int   `json:"type"`
	}
	out := run(t, time.Minute, "nbdinfo", "--map", "--json", u)
	if err := json.Unmarshal([]byte(out), &extents); err != nil {
		t.Fatalf("nbdinfo --map --json: %v\n%s", err, out)
	}
	var data, holes int64
	for _, e := range extents {
		if e.Type&1 != 0 {
			holes += e.Length
		} else {
			data += e.Length
			// Every data extent holds one of the writes (the store maps
			// 64 KiB clusters, the writes are aligned to them).
			in := func(lo, hi int64) bool { return e.Offset >= lo && e.Offset+e.Length <= hi }
			if !in(1<<20, 2<<20) && !in(100<<20, 100<<20+64<<10) && !in(511<<20, 512<<20) {
				t.Errorf("data extent %+v outside what was written", e)
			}
		}
	}
	if data != 2<<20+64<<10 || data+holes != 512<<20 {
		t.Fatalf("nbdinfo --map: %d bytes of data, %d of holes:\n%s", data, holes, out)
	}
	t.Logf("nbdinfo --map: %d extents, %d bytes of data, %d bytes of holes", len(extents), data, holes)

	dir := t.TempDir()
	readsBefore := s.metric(t, `rtarget_ops_total{op="read"}`)
	img := filepath.Join(dir, "nbdcopy.img")
	run(t, time.Minute, "nbdcopy", u, img)
	reads := s.metric(t, `rtarget_ops_total{op="read"}`) - readsBefore
	qimg := filepath.Join(dir, "qemu.img")
	run(t, time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", u, qimg)
	want := volumeSum(t, u, dir)
	for _, f := range []string{img, qimg} {
		if fileSum(t, f, 512<<20) != want {
			t.Errorf("%s differs from the volume", filepath.Base(f))
		}
		var st syscall.Stat_t
		if err := syscall.Stat(f, &st); err != nil {
			t.Fatal(err)
		}
		if alloc := st.Blocks * 512; alloc > 8<<20 {
			t.Errorf("%s takes %d bytes on disk: the holes were copied as data", filepath.Base(f), alloc)
		} else {
			t.Logf("%s: %d bytes on disk of 512 MiB", filepath.Base(f), alloc)
		}
	}
	// nbdcopy reads what holds data (a few requests), not 512 MiB.
	if reads > 64 {
		t.Errorf("nbdcopy made %d reads of the target for 2 MiB of data", reads)
	}
	t.Logf("nbdcopy: %d reads of the target", reads)
}

// volumeSum reads the whole volume with qemu-img (dd) into a file and
// returns its digest.
func volumeSum(t *testing.T, u, dir string) [32]byte {
	t.Helper()
	full := filepath.Join(dir, "full.img")
	run(t, time.Minute, "qemu-img", "dd", "-f", "raw", "-O", "raw", "bs=1M", "if="+u, "of="+full)
	defer os.Remove(full)
	return fileSum(t, full, 512<<20)
}
