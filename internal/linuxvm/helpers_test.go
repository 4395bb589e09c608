package linuxvm

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// vmCache is TestCache (kept for this package's tests).
func vmCache(t *testing.T) string {
	t.Helper()
	return TestCache(t)
}

// testWriter sends build output to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// forwardPorts returns n distinct ports for Config.Forwards: free a moment
// ago and below the kernel's ephemeral range (32768 and up), so that no
// outgoing connection of a test running beside this one (go test runs
// packages in parallel) can take one before QEMU binds its forward; a port
// from freePort could be, and QEMU then stops at once. They are distinct
// because each is free again once checked: QEMU refuses a port forwarded
// twice (two calls of a one-port version, close together, once returned
// the same port).
func forwardPorts(t *testing.T, n int) []int {
	t.Helper()
	const lo, hi = 20000, 32768
	start := lo + int(time.Now().UnixNano()%int64(hi-lo))
	ports := make([]int, 0, n)
	for i := 0; i < hi-lo && len(ports) < n; i++ {
		p := lo + (start-lo+i)%(hi-lo)
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			l.Close()
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		t.Fatalf("only %d of %d free ports below 32768", len(ports), n)
	}
	return ports
}

// startNBDKit serves a 64 MiB RAM disk with nbdkit on 127.0.0.1:port until
// the test ends.
func startNBDKit(t *testing.T, port int) {
	t.Helper()
	bin, err := exec.LookPath("nbdkit")
	if err != nil {
		t.Fatalf("nbdkit not installed (apt-get install nbdkit): %v", err)
	}
	// nbdkit writes its pid file once it accepts connections.
	pidFile := filepath.Join(t.TempDir(), "nbdkit.pid")
	cmd := exec.Command(bin, "-f", "--exit-with-parent", "-P", pidFile, "-i", "127.0.0.1", "-p", itoa(port), "memory", "64M")
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdkit did not start on port %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// buildHello builds a static Go program into dir/hello.
func buildHello(t *testing.T, dir string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	src := t.TempDir()
	prog := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\t\"runtime\"\n)\n\n" +
		"func main() {\n\th, _ := os.Hostname()\n\tfmt.Printf(\"hello from a static Go binary (%s/%s, %d CPUs, host %q)\\n\", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), h)\n}\n"
	if err := os.WriteFile(filepath.Join(src, "hello.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, "hello"), "hello.go")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build hello: %v\n%s", err, out)
	}
}

// tapProxy listens on 127.0.0.1 and relays each connection to target,
// keeping the first bytes of each direction of the first connection.
type tapProxy struct {
	l      net.Listener
	target string

	mu       sync.Mutex
	toServer []byte // what the connecting side sent
	toClient []byte // what the target answered
	wg       sync.WaitGroup
}

const tapKeep = 16 << 10

func newTapProxy(t *testing.T, target string) *tapProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tapProxy{l: l, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *tapProxy) port() int { return p.l.Addr().(*net.TCPAddr).Port }

func (p *tapProxy) serve() {
	defer p.wg.Done()
	first := true
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(c, first)
		first = false
	}
}

func (p *tapProxy) relay(c net.Conn, record bool) {
	defer p.wg.Done()
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn, keep *[]byte) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if record {
					p.mu.Lock()
					if room := tapKeep - len(*keep); room > 0 {
						*keep = append(*keep, buf[:min(n, room)]...)
					}
					p.mu.Unlock()
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					c.Close()
					s.Close()
					return
				}
			}
			if errors.Is(err, io.EOF) {
				// Pass the FIN on so each side sees the other's orderly close.
				dst.(*net.TCPConn).CloseWrite()
				return
			}
			if err != nil {
				c.Close()
				s.Close()
				return
			}
		}
	}
	go cp(s, c, &p.toServer)
	go cp(c, s, &p.toClient)
	wg.Wait()
}

func (p *tapProxy) recorded() (toServer, toClient []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.toServer...), append([]byte(nil), p.toClient...)
}

func itoa(n int) string { return strconv.Itoa(n) }
