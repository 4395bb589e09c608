package linuxvm

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rpingPattern is what rping's client puts in its buffer for ping number
// ping with -S size (rdma-core librdmacm/examples/rping.c,
// rping_test_client): "rdma-ping-%d: " then ASCII 'A'..'z' rotating, starting
// one character later on each ping, and a NUL in the last byte. It returns
// the printable part.
func rpingPattern(ping, size int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", ping))
	c := byte(65 + ping%58)
	for len(b) < size-1 {
		b = append(b, c)
		if c++; c > 122 {
			c = 65
		}
	}
	return string(b[:size-1])
}

func TestRPingPattern(t *testing.T) {
	got := rpingPattern(1, 80)
	want := "rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzABCDEFGHI"
	if got != want {
		t.Fatalf("pattern\n got %q\nwant %q", got, want)
	}
	if p := rpingPattern(58, 20); !strings.HasPrefix(p, "rdma-ping-58: A") {
		t.Fatalf("ping 58 should restart at 'A': %q", p)
	}
}

// guestChecks is the guest script of TestVM. Lines starting "CHECK " carry
// results the test asserts on.
const guestChecks = `
set -u
SP={{SERVER_PORT}}; PP={{PROXY_PORT}}; NP={{NBD_PORT}}
echo "CHECK cmdline $(cat /proc/cmdline)"
ibv_devinfo; echo "CHECK ibv_devinfo rc=$?"
waitlisten() { local w=0; while ! netstat -ltn 2>/dev/null | grep -q ":$1 "; do
  w=$((w+1)); [ $w -gt 300 ] && return 1; sleep 0.1; done; }

# rping: server in the guest, client in the guest reaching it through the host
# (guest -> 10.0.2.2:PP -> test's TCP relay -> 127.0.0.1:SP -> forward -> guest:SP).
# rping's client exits 0 even when the connection drops before any ping: the test
# counts the "ping data" lines.
rping -s {{SERVER_OPTS}} -a 10.0.2.15 -p $SP -C 5 -S 256 -v >/tmp/rs 2>&1 &
SPID=$!
waitlisten $SP || echo "CHECK rping server never listened"
timeout 120 rping -c -a 10.0.2.2 -p $PP -C 5 -S 256 -v -V >/tmp/rc 2>&1
echo "CHECK rping-client rc=$?"
wait $SPID; echo "CHECK rping-server rc=$?"
sed 's/^/CLIENT /' /tmp/rc; sed 's/^/SERVER /' /tmp/rs

# The kernel NBD client on the host's nbdkit.
nbd-client 10.0.2.2 $NP /dev/nbd0 -N rnic >/tmp/nbd 2>&1; echo "CHECK nbd-client rc=$?"; cat /tmp/nbd
mkfs.ext4 -q -F /dev/nbd0; echo "CHECK mkfs rc=$?"
mkdir -p /mnt/n && mount -t ext4 /dev/nbd0 /mnt/n; echo "CHECK mount rc=$?"
dd if=/dev/urandom of=/tmp/f bs=1M count=4 2>/dev/null && cp /tmp/f /mnt/n/f && umount /mnt/n \
  && mount -t ext4 /dev/nbd0 /mnt/n && cmp /tmp/f /mnt/n/f; echo "CHECK remount-cmp rc=$?"
umount /mnt/n; e2fsck -fn /dev/nbd0; echo "CHECK e2fsck rc=$?"
nbd-client -d /dev/nbd0 >/dev/null 2>&1; echo "CHECK nbd-disconnect rc=$?"

# A static Go binary from the host share.
grep ' /host ' /proc/mounts
/host/hello; echo "CHECK hello rc=$?"
`

func TestVM(t *testing.T) {
	cache := vmCache(t)
	for _, v := range []Variant{Stock, CRC1} {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			testVariant(t, cache, v)
		})
	}
}

func testVariant(t *testing.T, cache string, v Variant) {
	testStart := time.Now()
	serverPort, nbdPort := forwardPorts(t, 1)[0], freePort(t)
	proxy := newTapProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(serverPort)))
	startNBDKit(t, nbdPort)
	share := t.TempDir()
	buildHello(t, share)

	// MPA rev 1 carries no IRD/ORD: siw reports 0/0 in the connect request and
	// rdma_accept(NULL) then leaves the server QP with ORD 0, so its RDMA Read
	// fails ("post send error -1"). rping -q accepts with IRD=ORD=1 explicitly.
	serverOpts := ""
	if v == CRC1 {
		serverOpts = "-q"
	}
	script := strings.NewReplacer("{{SERVER_OPTS}}", serverOpts, "{{SERVER_PORT}}", strconv.Itoa(serverPort),
		"{{PROXY_PORT}}", strconv.Itoa(proxy.port()), "{{NBD_PORT}}", strconv.Itoa(nbdPort)).Replace(guestChecks)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{CacheDir: cache, Variant: v, GuestScript: script, ShareDir: share,
		Forwards: []int{serverPort}, Timeout: 8 * time.Minute})
	if res != nil {
		for _, l := range res.Lines {
			t.Logf("guest: %s", l)
		}
	}
	if err != nil {
		t.Fatalf("VM run: %v", err)
	}
	t.Logf("variant %s: guest ready after %v, VM total %v, test total %v",
		v, res.Ready.Round(time.Millisecond), res.Total.Round(time.Millisecond), time.Since(testStart).Round(time.Millisecond))

	lines := res.Lines
	has := func(s string) bool {
		for _, l := range lines {
			if strings.Contains(l, s) {
				return true
			}
		}
		return false
	}
	for _, want := range []string{
		"RNICVM: siw loaded variant=" + string(v),
		"hca_id:\tsiw0",
		"transport:\t\t\tiWARP (1)",
		"state:\t\t\tPORT_ACTIVE (4)",
		"CHECK ibv_devinfo rc=0",
		"CHECK rping-client rc=0",
		"CHECK rping-server rc=0",
		"CHECK nbd-client rc=0",
		"CHECK mkfs rc=0",
		"CHECK mount rc=0",
		"CHECK remount-cmp rc=0",
		"CHECK e2fsck rc=0",
		"CHECK nbd-disconnect rc=0",
		"host /host 9p",
		"hello from a static Go binary (linux/amd64",
		"CHECK hello rc=0",
	} {
		if !has(want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	// rping -v: both sides print each ping's data, which the test recomputes.
	for i := 0; i < 5; i++ {
		p := rpingPattern(i, 256)
		if !has("CLIENT ping data: " + p) {
			t.Errorf("client did not print ping %d data %q", i, p)
		}
		if !has("SERVER server ping data: " + p) {
			t.Errorf("server did not print ping %d data", i)
		}
	}
	if has("CLIENT ping data: rdma-ping-5:") {
		t.Errorf("client did more than 5 pings")
	}
	if !has("CHECK rping-client rc=0") || !has("CHECK rping-server rc=0") {
		logFPDUs(t, proxy)
	}
	checkMPA(t, v, proxy)
}

// logFPDUs logs the FPDUs the relay saw after the MPA Request and Reply,
// in each direction, up to tapKeep bytes; their CRCs are checked when the
// Reply set its CRC bit.
func logFPDUs(t *testing.T, proxy *tapProxy) {
	t.Helper()
	toServer, toClient := proxy.recorded()
	rep, err := parseMPARR(toClient)
	withCRC := err == nil && rep.CRC()
	for _, d := range []struct {
		name string
		b    []byte
	}{{"client -> server", toServer}, {"server -> client", toClient}} {
		f, err := parseMPARR(d.b)
		if err != nil {
			t.Logf("relay, %s: %d bytes, no MPA frame: %v", d.name, len(d.b), err)
			continue
		}
		t.Logf("relay, %s: %d bytes after the MPA frame: %s", d.name, len(d.b)-len(f), fpduSummary(d.b[len(f):], withCRC))
	}
}

// checkMPA asserts that the MPA Request and Reply the relay saw are the ones
// of the siw variant.
func checkMPA(t *testing.T, v Variant, proxy *tapProxy) {
	t.Helper()
	toServer, toClient := proxy.recorded()
	req, err := parseMPARR(toServer)
	if err != nil {
		t.Fatalf("MPA request: %v (% x)", err, toServer)
	}
	rep, err := parseMPARR(toClient)
	if err != nil {
		t.Fatalf("MPA reply: %v (% x)", err, toClient)
	}
	t.Logf("MPA request % x", []byte(req))
	t.Logf("MPA reply   % x", []byte(rep))
	if req.Key() != "MPA ID Req Frame" || rep.Key() != "MPA ID Rep Frame" {
		t.Fatalf("keys %q / %q", req.Key(), rep.Key())
	}
	if req.Markers() || rep.Markers() || rep.Reject() {
		t.Errorf("markers or reject set: req % x rep % x", req[16:20], rep[16:20])
	}
	switch v {
	case Stock:
		if req.Rev() != 2 || rep.Rev() != 2 || req.CRC() || rep.CRC() || !req.Enhanced() || !rep.Enhanced() {
			t.Errorf("stock: want rev 2, enhanced, no CRC: req % x rep % x", req[16:20], rep[16:20])
		}
		reqIRD, reqORD, ok1 := req.IRDORD()
		repIRD, repORD, ok2 := rep.IRDORD()
		if !ok1 || !ok2 {
			t.Fatalf("stock: no IRD/ORD words: req % x rep % x", []byte(req), []byte(rep))
		}
		t.Logf("IRD/ORD words: request %#04x/%#04x, reply %#04x/%#04x", reqIRD, reqORD, repIRD, repORD)
	case CRC1:
		if req.Rev() != 1 || rep.Rev() != 1 || !req.CRC() || !rep.CRC() || req.Enhanced() || rep.Enhanced() {
			t.Errorf("crc1: want rev 1, CRC, not enhanced: req % x rep % x", req[16:20], rep[16:20])
		}
	}
}
