package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rnic-dev/rnic/store"
)

// The control socket: while rtarget serve runs, it holds the store, and the
// volume commands reach it through a unix socket (in a thin store's --data
// directory, rtarget.sock), one JSON request per line and one JSON response
// per line, any number on one connection. Only the owner may connect
// (mode 0600, which the socket has from the moment it is at its path:
// listenPrivate).

// controlVersion is the version of the requests and responses.
const controlVersion = 1

// maxControlLine bounds a request line. The largest request, a volume's
// metadata (at most store.MaxMetaLen bytes, escaped in JSON), is far below
// it; a longer line is refused and its connection closed, so that nothing
// a client sends makes the daemon buffer without end.
const maxControlLine = 1 << 20

type controlRequest struct {
	Version int               `json:"v"`
	Op      string            `json:"op"`
	Name    string            `json:"name,omitempty"` // volume
	Snap    string            `json:"snap,omitempty"`
	NewName string            `json:"new_name,omitempty"`
	Size    int64             `json:"size,omitempty"`
	Raw     string            `json:"raw,omitempty"`
	Meta    map[string]string `json:"meta,omitempty"`
}

type controlResponse struct {
	Error    string              `json:"error,omitempty"`
	Code     string              `json:"code,omitempty"` // the store error it wraps, by name
	Volume   *store.VolumeInfo   `json:"volume,omitempty"`
	Volumes  []store.VolumeInfo  `json:"volumes,omitempty"`
	Snapshot *store.SnapshotInfo `json:"snapshot,omitempty"`
}

// controlCodes name the store errors a response carries, so errors.Is
// works on the client's side as on the store's.
var controlCodes = []struct {
	code string
	err  error
}{
	{"not_found", store.ErrNotFound},
	{"exists", store.ErrExists},
	{"busy", store.ErrBusy},
	{"invalid", store.ErrInvalid},
	{"not_supported", store.ErrNotSupported},
	{"has_dependents", store.ErrHasDependents},
	{"read_only", store.ErrReadOnly},
	{"closed", store.ErrClosed},
	{"corrupt", store.ErrCorrupt},
	{"shrink", store.ErrShrink},
}

// remoteError is an error the daemon returned.
type remoteError struct {
	msg string
	is  error // the store error it wraps, or nil
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// controlServer answers the control socket of rtarget serve.
type controlServer struct {
	st   volumeManager
	log  *slog.Logger
	ln   net.Listener
	path string
	wg   sync.WaitGroup

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool // close has ended the connections in conns
}

// listenControl listens on path. The caller holds the store, so a socket
// file left there by an earlier daemon is stale and is replaced.
func listenControl(path string, st volumeManager, log *slog.Logger) (*controlServer, error) {
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return serveControl(ln, path, st, log), nil
}

// serveControl answers the connections ln accepts; close removes path.
func serveControl(ln net.Listener, path string, st volumeManager, log *slog.Logger) *controlServer {
	s := &controlServer{st: st, log: log.With("component", "control"), ln: ln, path: path, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

func (s *controlServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("control socket accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closing {
			// Accepted before close stopped the listener, but after it
			// ended the connections it knew of: nothing would end this
			// one's reads.
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// serveConn answers the requests of one connection until it ends.
func (s *controlServer) serveConn(c net.Conn) {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 4096), maxControlLine)
	enc := json.NewEncoder(c)
	for sc.Scan() {
		line := sc.Bytes()
		var req controlRequest
		resp := controlResponse{}
		if jerr := json.Unmarshal(line, &req); jerr != nil {
			resp.Error, resp.Code = "bad request: "+jerr.Error(), "invalid"
		} else if req.Version != controlVersion {
			resp.Error, resp.Code = fmt.Sprintf("request version %d, this rtarget speaks %d", req.Version, controlVersion), "invalid"
		} else {
			start := time.Now()
			resp = s.do(context.Background(), req)
			attrs := []any{"op", req.Op, "volume", req.Name, "took", time.Since(start).Round(time.Microsecond)}
			if resp.Error != "" {
				s.log.Warn("volume command failed", append(attrs, "err", resp.Error)...)
			} else {
				s.log.Info("volume command", attrs...)
			}
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		// The rest of the line is unread: the connection cannot go on.
		err := fmt.Errorf("request longer than %d bytes", maxControlLine)
		s.log.Warn("control socket: request refused", "err", err)
		enc.Encode(controlResponse{Error: "bad request: " + err.Error(), Code: "invalid"})
	}
}

// do runs one request on the store.
func (s *controlServer) do(ctx context.Context, req controlRequest) controlResponse {
	var resp controlResponse
	var err error
	info := func(vi store.VolumeInfo, e error) {
		resp.Volume, err = &vi, e
	}
	switch req.Op {
	case "create":
		info(s.st.CreateVolume(ctx, req.Name, req.Size, store.CreateOptions{Raw: req.Raw, Meta: req.Meta}))
	case "stat":
		info(s.st.StatVolume(ctx, req.Name))
	case "list":
		resp.Volumes, err = s.st.ListVolumes(ctx)
	case "delete":
		err = s.st.DeleteVolume(ctx, req.Name)
	case "resize":
		err = s.st.ResizeVolume(ctx, req.Name, req.Size)
	case "grow":
		err = s.st.GrowVolume(ctx, req.Name, req.Size)
	case "snapshot":
		var si store.SnapshotInfo
		si, err = s.st.CreateSnapshot(ctx, req.Name, req.Snap)
		resp.Snapshot = &si
	case "delete-snapshot":
		err = s.st.DeleteSnapshot(ctx, req.Name, req.Snap)
	case "clone":
		info(s.st.Clone(ctx, req.Name, req.Snap, req.NewName, store.CreateOptions{Meta: req.Meta}))
	case "rollback":
		err = s.st.Rollback(ctx, req.Name, req.Snap)
	case "set-meta":
		err = s.st.SetMeta(ctx, req.Name, req.Meta)
	default:
		err = fmt.Errorf("unknown operation %q: %w", req.Op, store.ErrInvalid)
	}
	if err != nil {
		resp = controlResponse{Error: err.Error()}
		for _, c := range controlCodes {
			if errors.Is(err, c.err) {
				resp.Code = c.code
				break
			}
		}
	}
	return resp
}

// close stops accepting, ends the connections and removes the socket. A
// connection's reads and writes both end: a client that stopped reading
// in the middle of a response would otherwise hold its write, and so the
// daemon's exit, for ever. A request being run finishes first. A
// connection accepted while close runs is closed by the accept loop
// (closing).
func (s *controlServer) close() {
	s.ln.Close()
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.SetDeadline(time.Now())
	}
	s.mu.Unlock()
	s.wg.Wait()
	os.Remove(s.path)
}

// listenPrivate listens on a unix socket at path that only its owner can
// connect to from the moment it is there: it is bound in a new directory
// of mode 0700 beside path, made 0600 there, and then renamed to path
// (replacing what is there). Bound at path, it would be open to everyone
// the umask lets in until a chmod; and the umask, which could close that
// window, is the process's: the files other goroutines create meanwhile
// (the store's) would get it too.
//
// The caller holds the store's lock, so no other process binds beside
// path meanwhile: a directory of that pattern already there is one a
// process killed while it bound left behind, and is removed.
func listenPrivate(path string) (*net.UnixListener, error) {
	dir, prefix := filepath.Dir(path), "."+filepath.Base(path)+"."
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				os.RemoveAll(filepath.Join(dir, e.Name()))
			}
		}
	}
	tmp, err := os.MkdirTemp(dir, prefix)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// MkdirTemp's 0700 less the umask: the owner needs all of it.
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, err
	}
	bound := filepath.Join(tmp, filepath.Base(path))
	var ln *net.UnixListener
	err = withUnixAddr(bound, func(addr string) (err error) {
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		return err
	})
	if err != nil {
		return nil, err
	}
	// The address names where the socket was bound, maybe through a
	// descriptor closed by now: controlServer.close removes it by path.
	ln.SetUnlinkOnClose(false)
	if err = os.Chmod(bound, 0o600); err == nil {
		err = os.Rename(bound, path)
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// maxUnixPath is the longest path a unix socket address holds on Linux
// (sun_path: 108 bytes with the terminating NUL).
const maxUnixPath = 107

// withUnixAddr calls f with a unix socket address for the file at path.
// A path too long for the address (a deep --data directory, such as a
// Kubernetes volume's mount point) is reached through a descriptor of its
// directory, /proc/self/fd/N/NAME, which the kernel resolves as it would
// the path; the descriptor is closed when f returns.
func withUnixAddr(path string, f func(addr string) error) error {
	if len(path) <= maxUnixPath {
		return f(path)
	}
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return f(fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path)))
}

// controlClient is a volumeManager that asks the daemon.
type controlClient struct {
	c   net.Conn
	r   *bufio.Reader
	enc *json.Encoder
}

// dialControl connects to the daemon's control socket; it fails when no
// daemon listens there.
func dialControl(path string) (*controlClient, error) {
	var c net.Conn
	err := withUnixAddr(path, func(addr string) (err error) {
		c, err = net.Dial("unix", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &controlClient{c: c, r: bufio.NewReader(c), enc: json.NewEncoder(c)}, nil
}

func (cc *controlClient) close() error { return cc.c.Close() }

func (cc *controlClient) call(ctx context.Context, req controlRequest) (controlResponse, error) {
	req.Version = controlVersion
	if d, ok := ctx.Deadline(); ok {
		cc.c.SetDeadline(d)
	}
	if err := cc.enc.Encode(req); err != nil {
		return controlResponse{}, fmt.Errorf("control socket: %w", err)
	}
	line, err := cc.r.ReadBytes('\n')
	if err != nil {
		return controlResponse{}, fmt.Errorf("control socket: %w", err)
	}
	var resp controlResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return controlResponse{}, fmt.Errorf("control socket: bad response: %w", err)
	}
	if resp.Error != "" {
		re := &remoteError{msg: resp.Error}
		for _, c := range controlCodes {
			if c.code == resp.Code {
				re.is = c.err
			}
		}
		return resp, re
	}
	return resp, nil
}

func (cc *controlClient) volume(ctx context.Context, req controlRequest) (store.VolumeInfo, error) {
	resp, err := cc.call(ctx, req)
	if err != nil || resp.Volume == nil {
		return store.VolumeInfo{}, err
	}
	return *resp.Volume, nil
}

func (cc *controlClient) CreateVolume(ctx context.Context, name string, size int64, opts store.CreateOptions) (store.VolumeInfo, error) {
	return cc.volume(ctx, controlRequest{Op: "create", Name: name, Size: size, Raw: opts.Raw, Meta: opts.Meta})
}

func (cc *controlClient) StatVolume(ctx context.Context, name string) (store.VolumeInfo, error) {
	return cc.volume(ctx, controlRequest{Op: "stat", Name: name})
}

func (cc *controlClient) ListVolumes(ctx context.Context) ([]store.VolumeInfo, error) {
	resp, err := cc.call(ctx, controlRequest{Op: "list"})
	return resp.Volumes, err
}

func (cc *controlClient) DeleteVolume(ctx context.Context, name string) error {
	_, err := cc.call(ctx, controlRequest{Op: "delete", Name: name})
	return err
}

func (cc *controlClient) ResizeVolume(ctx context.Context, name string, size int64) error {
	_, err := cc.call(ctx, controlRequest{Op: "resize", Name: name, Size: size})
	return err
}

func (cc *controlClient) GrowVolume(ctx context.Context, name string, size int64) error {
	_, err := cc.call(ctx, controlRequest{Op: "grow", Name: name, Size: size})
	return err
}

func (cc *controlClient) CreateSnapshot(ctx context.Context, vol, snap string) (store.SnapshotInfo, error) {
	resp, err := cc.call(ctx, controlRequest{Op: "snapshot", Name: vol, Snap: snap})
	if err != nil || resp.Snapshot == nil {
		return store.SnapshotInfo{}, err
	}
	return *resp.Snapshot, nil
}

func (cc *controlClient) DeleteSnapshot(ctx context.Context, vol, snap string) error {
	_, err := cc.call(ctx, controlRequest{Op: "delete-snapshot", Name: vol, Snap: snap})
	return err
}

func (cc *controlClient) Clone(ctx context.Context, vol, snap, newName string, opts store.CreateOptions) (store.VolumeInfo, error) {
	return cc.volume(ctx, controlRequest{Op: "clone", Name: vol, Snap: snap, NewName: newName, Meta: opts.Meta})
}

func (cc *controlClient) Rollback(ctx context.Context, vol, snap string) error {
	_, err := cc.call(ctx, controlRequest{Op: "rollback", Name: vol, Snap: snap})
	return err
}

func (cc *controlClient) SetMeta(ctx context.Context, name string, meta map[string]string) error {
	_, err := cc.call(ctx, controlRequest{Op: "set-meta", Name: name, Meta: meta})
	return err
}

var _ volumeManager = (*controlClient)(nil)
