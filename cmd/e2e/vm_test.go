package e2e

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/gobuild"
	"github.com/rnic-dev/rnic/internal/linuxvm"
)

// guestNBD is the guest script of TestKernelNBD: the Linux kernel NBD client
// (nbd-client) on rinit's export, then rinit attach inside the guest, each
// with ext4, a write, sync, a remount that compares, and e2fsck.
const guestNBD = `
set -u
disk() { # device label
  mkfs.ext4 -q -F $1; echo "CHECK $2 mkfs rc=$?"
  mkdir -p /mnt/$2 && mount -t ext4 $1 /mnt/$2; echo "CHECK $2 mount rc=$?"
  dd if=/dev/urandom of=/tmp/$2 bs=1M count=8 2>/dev/null
  cp /tmp/$2 /mnt/$2/f && sync; echo "CHECK $2 write-sync rc=$?"
  umount /mnt/$2 && mount -t ext4 $1 /mnt/$2 && cmp /tmp/$2 /mnt/$2/f; echo "CHECK $2 remount-cmp rc=$?"
  md5sum /tmp/$2 | sed "s/^/CHECK $2 md5 /"
  umount /mnt/$2; e2fsck -fn $1; echo "CHECK $2 e2fsck rc=$?"
}
nbd-client 10.0.2.2 {{NBD_PORT}} /dev/nbd0 -N knbd -b 4096; echo "CHECK kernel nbd-client rc=$?"
disk /dev/nbd0 kernel
nbd-client -d /dev/nbd0; echo "CHECK kernel nbd-disconnect rc=$?"

/host/rinit attach --device /dev/nbd1 --target 10.0.2.2:{{TARGET_PORT}} --volume attach --name guest >/tmp/ra 2>&1 &
RPID=$!
w=0; while ! grep -q attached /tmp/ra; do w=$((w+1)); [ $w -gt 600 ] && break; sleep 0.1; done
grep -q attached /tmp/ra; echo "CHECK attach up rc=$?"
disk /dev/nbd1 attach
kill -TERM $RPID; wait $RPID; echo "CHECK attach exit rc=$?"
sed 's/^/RINIT /' /tmp/ra
`

// TestKernelNBD boots the Linux VM (see internal/linuxvm) and uses the
// kernel NBD client against rinit on the host, then runs rinit attach in
// the guest (a static binary through the 9p share) against rtarget on the
// host. Both volumes live in the thin store.
func TestKernelNBD(t *testing.T) {
	cache := linuxvm.TestCache(t)
	rt, ri := bins(t)
	share := t.TempDir()
	if out, err := gobuild.Build([]string{"CGO_ENABLED=0"}, "-o", filepath.Join(share, "rinit"), "github.com/rnic-dev/rnic/cmd/rinit"); err != nil {
		t.Fatalf("static rinit: %v\n%s", err, out)
	}
	targetAddr, nbdAddr := freePort(t), freePort(t)
	target := start(t, rt, "serve", "--data", t.TempDir(), "--listen", targetAddr, "--volume", "knbd:256M", "--volume", "attach:256M")
	waitPort(t, targetAddr, target)
	rinit := start(t, ri, "nbd", "--target", targetAddr, "--volume", "knbd", "--listen", nbdAddr, "--name", "host")
	waitPort(t, nbdAddr, rinit)
	_, tport, _ := net.SplitHostPort(targetAddr)
	_, nport, _ := net.SplitHostPort(nbdAddr)
	script := strings.NewReplacer("{{NBD_PORT}}", nport, "{{TARGET_PORT}}", tport).Replace(guestNBD)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := linuxvm.Run(ctx, linuxvm.Config{CacheDir: cache, GuestScript: script, ShareDir: share, Timeout: 8 * time.Minute})
	if res != nil {
		for _, l := range res.Lines {
			t.Logf("guest: %s", l)
		}
	}
	if err != nil {
		t.Fatalf("VM: %v", err)
	}
	for _, want := range []string{
		"CHECK kernel nbd-client rc=0", "CHECK kernel mkfs rc=0", "CHECK kernel mount rc=0", "CHECK kernel write-sync rc=0",
		"CHECK kernel remount-cmp rc=0", "CHECK kernel e2fsck rc=0", "CHECK kernel nbd-disconnect rc=0",
		"CHECK attach up rc=0", "CHECK attach mkfs rc=0", "CHECK attach mount rc=0", "CHECK attach write-sync rc=0",
		"CHECK attach remount-cmp rc=0", "CHECK attach e2fsck rc=0", "CHECK attach exit rc=0",
	} {
		found := false
		for _, l := range res.Lines {
			if strings.Contains(l, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("guest output lacks %q", want)
		}
	}
}
