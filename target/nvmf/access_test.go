package nvmf

import (
	"net"
	"testing"
)

// TestAccess: a volume with an allow-list admits the listed host NQNs only
// (Connect Invalid Host for the others); one without admits loopback
// hosts, and refuses the others.
func TestAccess(t *testing.T) {
	listed := "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
	other := "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002"
	e := newTestEnv(t, envOpts{volumes: map[string]int64{"open": 8 << 20, "listed": 8 << 20},
		cfg: func(c *Config) { c.Hosts = map[string][]string{"listed": {listed}} }})
	if _, err := tryConnectHost(t, e.addr, e.srv.NQN("listed"), hostOpts{hostNQN: listed}); err != nil {
		t.Fatalf("listed host: %v", err)
	}
	_, err := tryConnectHost(t, e.addr, e.srv.NQN("listed"), hostOpts{hostNQN: other})
	if se, ok := err.(*StatusError); !ok || se.Status != StatusConnectInvalidHost|StatusDNR || se.Result != ipoConnectData|512 {
		t.Fatalf("unlisted host: %v", err)
	}
	if _, err := tryConnectHost(t, e.addr, e.srv.NQN("open"), hostOpts{hostNQN: other}); err != nil {
		t.Fatalf("loopback host on a volume without a list: %v", err)
	}
	if e.srv.allowed("open", other, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 1}) {
		t.Fatal("a remote host admitted to a volume without an allow-list")
	}
	if !e.srv.allowed("listed", listed, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 1}) {
		t.Fatal("a listed remote host refused")
	}
	// A real connection from a non-loopback address, where the machine has one.
	ip := nonLoopback()
	if ip == nil {
		t.Log("no non-loopback IPv4 address here: remote connection not tried")
		return
	}
	e2 := newTestEnv(t, envOpts{volumes: map[string]int64{"open": 8 << 20}})
	l, err := e2.dev.Listen(net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go e2.srv.Serve(t.Context(), l)
	_, err = tryConnectHost(t, l.Addr().String(), e2.srv.NQN("open"), hostOpts{})
	if se, ok := err.(*StatusError); !ok || se.Status != StatusConnectInvalidHost|StatusDNR {
		t.Fatalf("a host on %s: %v", ip, err)
	}
}

func nonLoopback() net.IP {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	return nil
}

// TestAccessIOQueue: an I/O queue is held to the volume's access rule as
// the admin queue is: on a volume without an allow-list, a queue from a
// non-loopback address may not join a controller a loopback host made,
// even with its controller ID and NQNs.
func TestAccessIOQueue(t *testing.T) {
	ip := nonLoopback()
	if ip == nil {
		t.Skip("no non-loopback IPv4 address here")
	}
	e := newTestEnv(t, envOpts{volumes: map[string]int64{"open": 8 << 20}})
	l, err := e.dev.Listen(net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go e.srv.Serve(t.Context(), l)
	h := connectHost(t, e.addr, e.srv.NQN("open"), hostOpts{ioQueues: -1})
	q, err := dialQueue(t, l.Addr().String(), 1, 32, dialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := q.connectCmd(h.nqn, h.hostNQN, h.hostID, h.cntlid, 31, 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status() != StatusConnectInvalidHost|StatusDNR {
		t.Fatalf("I/O queue from %s: %v, want %v", ip, r.status(), StatusConnectInvalidHost|StatusDNR)
	}
}
