package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/store"
)

// TestControlLineBound: a request line past maxControlLine is refused
// with an error and its connection closed, without the daemon buffering
// it; requests up to the bound, and new connections, are served.
func TestControlLineBound(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	path := filepath.Join(t.TempDir(), "rtarget.sock")
	srv, err := listenControl(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	ask := func(c net.Conn, r *bufio.Reader, line []byte) controlResponse {
		t.Helper()
		go c.Write(line) // the server may close before reading it all
		b, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		var resp controlResponse
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Fatalf("response %q: %v", b, err)
		}
		return resp
	}
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}

	c, r := dial()
	long := append(bytes.Repeat([]byte("x"), 2*maxControlLine), '\n')
	resp := ask(c, r, long)
	if resp.Code != "invalid" || !strings.Contains(resp.Error, "longer than") {
		t.Fatalf("a 2 MiB line: %+v", resp)
	}
	if _, err := r.ReadBytes('\n'); err == nil {
		t.Fatal("the connection stayed open after a refused line")
	}

	// Just under the bound: a create whose metadata pads the line (it
	// fails for the metadata's size, but it is read and answered), then
	// a list on the same connection.
	c, r = dial()
	req, _ := json.Marshal(controlRequest{Version: controlVersion, Op: "create", Name: "v", Size: 1 << 20,
		Meta: map[string]string{"pad": strings.Repeat("y", maxControlLine-200)}})
	if len(req)+1 > maxControlLine {
		t.Fatalf("test request of %d bytes is over the bound", len(req)+1)
	}
	if resp := ask(c, r, append(req, '\n')); strings.Contains(resp.Error, "longer than") {
		t.Fatalf("a line under the bound: %+v", resp)
	}
	req, _ = json.Marshal(controlRequest{Version: controlVersion, Op: "list"})
	if resp := ask(c, r, append(req, '\n')); resp.Error != "" {
		t.Fatalf("list after it: %+v", resp)
	}
}

// TestControlResize: through the socket, "grow" refuses a smaller size
// with the store's ErrShrink (errors.Is holds on the client's side) and
// changes nothing; "resize" shrinks.
func TestControlResize(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx := t.Context()
	if _, err := st.CreateVolume(ctx, "v", 4<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rtarget.sock")
	srv, err := listenControl(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	cc, err := dialControl(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.close()
	size := func() int64 {
		t.Helper()
		vi, err := cc.StatVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		return vi.Size
	}
	if err := cc.GrowVolume(ctx, "v", 1<<20); !errors.Is(err, store.ErrShrink) {
		t.Fatalf("grow to a smaller size: %v, want ErrShrink", err)
	}
	if got := size(); got != 4<<20 {
		t.Fatalf("size after a refused grow: %d", got)
	}
	if err := cc.GrowVolume(ctx, "v", 8<<20); err != nil || size() != 8<<20 {
		t.Fatalf("grow: %v, size %d", err, size())
	}
	if err := cc.ResizeVolume(ctx, "v", 1<<20); err != nil || size() != 1<<20 {
		t.Fatalf("resize to a smaller size: %v, size %d", err, size())
	}
}

// TestControlCloseBesideStuckClient: closing the control socket (rtarget
// serve stopping) ends a connection whose client stopped reading in the
// middle of a response; it does not wait for that client for ever.
func TestControlCloseBesideStuckClient(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx := t.Context()
	// A list response of several MiB: far more than a unix socket buffers.
	meta := map[string]string{"pad": strings.Repeat("m", store.MaxMetaLen-16)}
	for i := range 64 {
		if _, err := st.CreateVolume(ctx, "v"+strconv.Itoa(i), 1<<20, store.CreateOptions{Meta: meta}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "rtarget.sock")
	srv, err := listenControl(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := json.Marshal(controlRequest{Version: controlVersion, Op: "list"})
	if _, err := c.Write(append(req, '\n')); err != nil {
		t.Fatal(err)
	}
	// The first byte of the response: the server is writing it, and the
	// rest cannot fit in the socket until the client reads.
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	srv.close()
	// The connection was ended: what the server could not write is gone.
	rest, _ := io.ReadAll(c)
	if bytes.HasSuffix(rest, []byte("\n")) {
		t.Fatalf("the whole response (%d bytes) was written after close", len(rest)+1)
	}
}

// TestControlLongPath: a --data directory whose path leaves no room for
// the socket's name in a unix socket address (108 bytes on Linux) still
// gets its control socket, which volume commands reach, and which close
// removes.
func TestControlLongPath(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	if _, err := st.CreateVolume(t.Context(), "v", 1<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, controlSocketName)
	srv, err := listenControl(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("control socket at a path of %d bytes: %v", len(path), err)
	}
	cc, err := dialControl(path)
	if err != nil {
		srv.close()
		t.Fatalf("dial the control socket at a path of %d bytes: %v", len(path), err)
	}
	vs, err := cc.ListVolumes(t.Context())
	cc.close()
	if err != nil || len(vs) != 1 || vs[0].Name != "v" {
		t.Errorf("list through the socket: %v, %v", vs, err)
	}
	srv.close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after close: %v", err)
	}
}

// TestControlSocketNeverOpenToOthers: under a umask that leaves new files
// open to everyone (0), the control socket is never reachable at its path
// with a mode other than its final 0600: it appears there (created or moved
// in) with that mode, and no change of its mode follows, which would mean
// that it was there, open to other local users, before. The data directory
// is watched with inotify while rtarget serve starts.
func TestControlSocketNeverOpenToOthers(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, data, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	cmd := rtargetCmd(t, "serve", "--data", data, "--store", "thin", "--listen", "127.0.0.1:0", "--reserve", "1M")
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to set the umask with")
	}
	cmd.Args = append([]string{"sh", "-c", `umask 0 && exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = sh
	d := startDaemon(t, cmd)
	d.waitLog(`msg="control socket"`)

	var events []string
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if name != controlSocketName {
				continue
			}
			switch {
			case ev.Mask&unix.IN_CREATE != 0:
				events = append(events, "created")
			case ev.Mask&unix.IN_MOVED_TO != 0:
				events = append(events, "moved in")
			case ev.Mask&unix.IN_ATTRIB != 0:
				events = append(events, "mode changed")
			}
		}
	}
	if len(events) != 1 {
		t.Errorf("the control socket at its path: %q, want it to appear once with its final mode and stay so", events)
	}
	fi, err := os.Stat(filepath.Join(data, controlSocketName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket of mode %v, want a socket of 0600", fi.Mode())
	}
	entries, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), "sock") && e.Name() != controlSocketName {
			t.Errorf("%s left in the data directory", e.Name())
		}
	}
	if status := d.stop(syscall.SIGTERM, 30*time.Second); status != 0 {
		t.Errorf("rtarget serve exited with status %d after SIGTERM", status)
	}
}

// heldListener holds each connection it accepts: it says so on accepted
// and hands it on only once release is closed.
type heldListener struct {
	net.Listener
	accepted, release chan struct{}
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted <- struct{}{}
		<-l.release
	}
	return c, err
}

// TestControlCloseBesideConnectionJustAccepted: a connection accepted just
// before close, which the accept loop had not handed to a goroutine of its
// own yet when close ended the connections it knew of, is ended too: close
// does not wait for ever on its idle client.
func TestControlCloseBesideConnectionJustAccepted(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	path := filepath.Join(t.TempDir(), "rtarget.sock")
	inner, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l := &heldListener{Listener: inner, accepted: make(chan struct{}), release: make(chan struct{})}
	srv := serveControl(l, path, st, slog.New(slog.DiscardHandler))
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-l.accepted
	closed := make(chan struct{})
	go func() {
		srv.close()
		close(closed)
	}()
	// Time for close to stop the listener and end the connections it
	// knows of, before the accept loop goes on with this one.
	time.Sleep(100 * time.Millisecond)
	close(l.release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close still waits, 10 s on, for an idle connection accepted just before it")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read on the connection after close: %v, want EOF (the daemon ended it)", err)
	}
}

// TestListenPrivateRemovesStaleBindDirs: a bind directory a process killed
// while it bound left beside the socket (with the socket in it) is removed
// by the next listen, which binds and leaves only the socket; other files
// of the directory, a file of the same prefix included, stay.
func TestListenPrivateRemovesStaleBindDirs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, controlSocketName)
	stale := filepath.Join(dir, "."+controlSocketName+".12345")
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, controlSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	keep := []string{"." + controlSocketName + ".file", "meta"}
	for _, k := range keep {
		if err := os.WriteFile(filepath.Join(dir, k), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := listenPrivate(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := append([]string{controlSocketName}, keep...)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("directory after listen: %q, want %q", names, want)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the socket: %v", err)
	}
	c.Close()
}
