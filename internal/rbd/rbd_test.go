//go:build ceph

package rbd_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/cephtest"
	"github.com/rnic-dev/rnic/internal/rbd"
)

var conf string

func TestMain(m *testing.M) { os.Exit(cephtest.Main(m, &conf)) }

const obj = 1 << rbd.ObjectOrder

// setup connects, makes a fresh namespace and an image of size bytes in it.
func setup(t *testing.T, size uint64) (*rbd.Pool, *rbd.Image) {
	t.Helper()
	c := cephtest.Connect(t, conf, 10*time.Second)
	spec := cephtest.Namespace(t, conf, c)
	p, err := c.OpenPool(spec, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Create("img", size); err != nil {
		t.Fatal(err)
	}
	img, err := p.Open("img")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	return p, img
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
	return b
}

func mustRead(t *testing.T, img *rbd.Image, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := img.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIO(t *testing.T) {
	_, img := setup(t, 3*obj)
	if s, err := img.Size(); err != nil || s != 3*obj {
		t.Fatalf("Size = %d, %v", s, err)
	}
	if got := mustRead(t, img, 0, 8192); !bytes.Equal(got, make([]byte, 8192)) {
		t.Fatal("a new image does not read as zeros")
	}
	// A write across an object boundary.
	data := pattern(3*4096, 1)
	off := int64(obj - 4096)
	if err := img.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := img.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, img, off, len(data)); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if err := img.ReadAt(make([]byte, 4096), 3*obj); err == nil {
		t.Fatal("a read past the end succeeded")
	}
}

// TestZeroing checks that a 4 KiB discard and write-zeroes in the middle
// of an object really zero (with librbd's defaults a partial discard leaves
// the data), in an image and in a clone whose parent holds data there.
func TestZeroing(t *testing.T) {
	p, img := setup(t, 2*obj)
	data := pattern(64<<10, 3)
	check := func(img *rbd.Image, what string) {
		t.Helper()
		if err := img.WriteAt(data, 8192); err != nil {
			t.Fatal(err)
		}
		if err := img.Discard(8192+4096, 4096); err != nil {
			t.Fatal(err)
		}
		if err := img.WriteZeroes(8192+3*4096, 8192); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(data)
		clear(want[4096:8192])
		clear(want[3*4096 : 5*4096])
		if got := mustRead(t, img, 8192, len(data)); !bytes.Equal(got, want) {
			t.Fatalf("%s: discard or write-zeroes of 4 KiB blocks did not zero them", what)
		}
	}
	check(img, "image")
	if err := img.CreateSnapshot("s"); err != nil {
		t.Fatal(err)
	}
	if err := p.Clone("img", "s", "kid"); err != nil {
		t.Fatal(err)
	}
	kid, err := p.Open("kid")
	if err != nil {
		t.Fatal(err)
	}
	defer kid.Close()
	// The clone's blocks come from the parent until zeroed in the clone.
	if err := kid.Discard(8192, 4096); err != nil {
		t.Fatal(err)
	}
	if err := kid.WriteZeroes(8192+5*4096, 4096); err != nil {
		t.Fatal(err)
	}
	got := mustRead(t, kid, 8192, len(data))
	if !isZero(got[:4096]) || !isZero(got[5*4096:6*4096]) {
		t.Fatal("clone: discard or write-zeroes left the parent's data visible")
	}
	if !bytes.Equal(got[6*4096:], data[6*4096:]) {
		t.Fatal("clone: the parent's other data is not visible")
	}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestMetadata(t *testing.T) {
	_, img := setup(t, obj)
	if _, ok, err := img.Metadata("k"); err != nil || ok {
		t.Fatalf("missing key: ok %v err %v", ok, err)
	}
	if err := img.SetMetadata("k", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := img.SetMetadata("k2", "v2"); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := img.Metadata("k"); err != nil || !ok || v != "v1" {
		t.Fatalf("Metadata = %q %v %v", v, ok, err)
	}
	m, err := img.AllMetadata()
	if err != nil || m["k"] != "v1" || m["k2"] != "v2" {
		t.Fatalf("AllMetadata = %v, %v", m, err)
	}
	if err := img.RemoveMetadata("k"); err != nil {
		t.Fatal(err)
	}
	if err := img.RemoveMetadata("k"); err != nil {
		t.Fatalf("removing a missing key: %v", err)
	}
	if _, ok, _ := img.Metadata("k"); ok {
		t.Fatal("removed key still there")
	}
}

func TestSnapshotsClonesRollbackResize(t *testing.T) {
	p, img := setup(t, obj)
	a, b := pattern(4096, 10), pattern(4096, 20)
	if err := img.WriteAt(a, 0); err != nil {
		t.Fatal(err)
	}
	if err := img.CreateSnapshot("s1"); err != nil {
		t.Fatal(err)
	}
	if err := img.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := img.CreateSnapshot("s1"); !errors.Is(err, rbd.ErrExists) {
		t.Fatalf("second snapshot s1: %v, want ErrExists", err)
	}
	snaps, err := img.Snapshots()
	if err != nil || len(snaps) != 1 || snaps[0].Name != "s1" || snaps[0].Size != obj || time.Since(snaps[0].Created) > time.Minute {
		t.Fatalf("Snapshots = %+v, %v", snaps, err)
	}
	// The snapshot keeps the old data; a clone starts from it.
	ro, err := p.OpenSnapshot("img", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, ro, 0, 4096); !bytes.Equal(got, a) {
		t.Fatal("snapshot does not hold the data of its time")
	}
	ro.Close()
	if err := p.Clone("img", "s1", "kid"); err != nil {
		t.Fatal(err)
	}
	kid, err := p.Open("kid")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, kid, 0, 4096); !bytes.Equal(got, a) {
		t.Fatal("clone does not start from its snapshot")
	}
	if par, ok, err := kid.Parent(); err != nil || !ok || par.Image != "img" || par.Snap != "s1" {
		t.Fatalf("Parent = %+v %v %v", par, ok, err)
	}
	if kids, err := img.Children("s1"); err != nil || len(kids) != 1 || kids[0] != p.Spec()+"/kid" {
		t.Fatalf("Children = %v, %v", kids, err)
	}
	if err := img.RemoveSnapshot("s1"); !errors.Is(err, rbd.ErrBusy) {
		t.Fatalf("removing a snapshot with a clone: %v, want ErrBusy", err)
	}
	if err := kid.Flatten(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := kid.Parent(); err != nil || ok {
		t.Fatalf("flattened clone still has a parent (%v)", err)
	}
	kid.Close()
	// Rollback returns the head to the snapshot.
	if err := img.Rollback("s1"); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, img, 0, 4096); !bytes.Equal(got, a) {
		t.Fatal("rollback did not restore the snapshot's data")
	}
	if err := img.RemoveSnapshot("s1"); err != nil {
		t.Fatal(err)
	}
	// Resize: grow reads zeros past the old end; shrink cuts.
	if err := img.Resize(2 * obj); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, img, obj, 4096); !isZero(got) {
		t.Fatal("grown range not zero")
	}
	if err := img.Resize(4096); err != nil {
		t.Fatal(err)
	}
	if s, _ := img.Size(); s != 4096 {
		t.Fatalf("size after shrink %d", s)
	}
	if err := p.Remove("img"); !errors.Is(err, rbd.ErrBusy) {
		t.Fatalf("removing an open image: %v, want ErrBusy", err)
	}
}

// TestLockFencing: two clients (two gateways) on one image. The owner of
// the exclusive lock keeps it when the other asks; the other takes it over
// by breaking it, which blocklists the first: its writes fail as fenced
// and the image keeps the new owner's data.
func TestLockFencing(t *testing.T) {
	p, a := setup(t, obj)
	if err := a.AcquireLock(); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.IsLockOwner(); err != nil || !ok {
		t.Fatalf("IsLockOwner = %v, %v", ok, err)
	}
	if err := a.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatal(err)
	}
	cb := cephtest.Connect(t, conf, 10*time.Second)
	pb, err := cb.OpenPool(p.Spec(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	b, err := pb.Open("img")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WriteAt(pattern(4096, 2), 0); !errors.Is(err, rbd.ErrLockLost) {
		t.Fatalf("write without the lock: %v, want ErrLockLost", err)
	}
	if err := b.AcquireLock(); !errors.Is(err, rbd.ErrLockLost) && !errors.Is(err, rbd.ErrBusy) {
		t.Fatalf("AcquireLock while owned: %v, want ErrLockLost or ErrBusy", err)
	}
	owners, err := b.LockOwners()
	if err != nil || len(owners) != 1 {
		t.Fatalf("LockOwners = %v, %v", owners, err)
	}
	start := time.Now()
	broken, err := b.TakeOverLock()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("take-over (break %v, blocklist, acquire) took %v", broken, time.Since(start))
	if !slices.Equal(broken, owners) {
		t.Fatalf("broke %v, want %v", broken, owners)
	}
	want := pattern(4096, 3)
	if err := b.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	err = a.WriteAt(pattern(4096, 4), 0)
	if !errors.Is(err, rbd.ErrFenced) {
		t.Fatalf("the old owner's write: %v, want ErrFenced", err)
	}
	if err := a.Flush(); err == nil {
		t.Log("the old owner's flush succeeded (nothing of it was pending)")
	}
	if got := mustRead(t, b, 0, 4096); !bytes.Equal(got, want) {
		t.Fatal("the fenced owner's write reached the image")
	}
	if !blocklisted(t, a) {
		t.Fatal("the old owner is not in the OSD blocklist")
	}
}

// blocklisted reports whether the cluster's blocklist has entries (the old
// owner's address; this test cluster has no other fenced clients at that
// moment that matter: any entry shows the break blocklisted).
func blocklisted(t *testing.T, _ *rbd.Image) bool {
	out := ceph(t, "osd", "blocklist", "ls")
	return bytes.Contains(out, []byte("127.0.0.1"))
}

func ceph(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ceph", append([]string{"--conf", conf, "--connect-timeout", "20"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ceph %v: %v: %s", args, err, out)
	}
	return out
}

// TestOpTimeout: with the OSDs paused (as unreachable as a cluster gets)
// a write fails with ErrTimeout after about the configured timeout instead
// of blocking forever.
func TestOpTimeout(t *testing.T) {
	c := cephtest.Connect(t, conf, 3*time.Second)
	spec := cephtest.Namespace(t, conf, c)
	p, err := c.OpenPool(spec, false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Create("img", obj); err != nil {
		t.Fatal(err)
	}
	img, err := p.Open("img")
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if err := img.WriteAt(pattern(4096, 1), 0); err != nil {
		t.Fatal(err)
	}
	ceph(t, "osd", "pause")
	paused := true
	if err := c.WaitForLatestOSDMap(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if paused {
			ceph(t, "osd", "unpause")
		}
	}()
	start := time.Now()
	err = img.WriteAt(pattern(4096, 2), 4096)
	el := time.Since(start)
	if !errors.Is(err, rbd.ErrTimeout) {
		t.Fatalf("write to a paused cluster: %v after %v, want ErrTimeout", err, el)
	}
	if el > 20*time.Second {
		t.Fatalf("the write failed only after %v (timeout 3s)", el)
	}
	t.Logf("write failed after %v: %v", el, err)
	ceph(t, "osd", "unpause")
	paused = false
	// The cluster back, the same handle works again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := img.WriteAt(pattern(4096, 3), 8192)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes still fail after unpause: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
