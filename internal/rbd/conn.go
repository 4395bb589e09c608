//go:build ceph

package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// DefaultTimeout bounds every operation on the cluster when Config.Timeout
// is 0. It is above osd_heartbeat_grace + osd_heartbeat_interval (26 s by
// default), as tcmu-runner's rbd handler sets it, so a cluster that is only
// marking a dead OSD down does not fail I/O that would have completed. One
// librbd request may be several operations in a row (an object-map update,
// then the write).
const DefaultTimeout = 30 * time.Second

// Config says how to reach a cluster.
type Config struct {
	ConfFile string        // ceph.conf; "" = librados' default search
	ID       string        // client name without "client." ("admin" if "")
	Timeout  time.Duration // per operation; 0 = DefaultTimeout
	// Options are extra librados/librbd configuration options, applied
	// after the file and after this package's own settings.
	Options map[string]string
}

// Conn is a connection to a cluster (one librados client instance: the
// unit the cluster blocklists when another client breaks its lock).
type Conn struct {
	conn    *rados.Conn
	timeout time.Duration
}

// settings are the librbd/librados options every connection gets; see the
// package documentation for why.
func settings(timeout time.Duration) map[string]string {
	// Whole seconds (the options' unit), rounded down so that a request of
	// a few operations stays within its caller's bound; at least 1.
	secs := strconv.Itoa(max(1, int(timeout/time.Second)))
	return map[string]string{
		// An acknowledged write is on every replica, and rbd_flush has
		// nothing of ours to write back.
		"rbd_cache": "false",
		// A discard of any whole 4 KiB block zeroes it (the defaults skip
		// discards smaller than 64 KiB, leaving the old data readable).
		"rbd_skip_partial_discard":      "false",
		"rbd_discard_granularity_bytes": "4096",
		// A full or unreachable cluster fails an operation with ETIMEDOUT
		// instead of blocking it forever.
		"rados_osd_op_timeout": secs,
		"rados_mon_op_timeout": secs,
		"client_mount_timeout": secs,
		// Breaking a lock blocklists its owner: the fencing failover needs.
		"rbd_blocklist_on_break_lock": "true",
		// Clones need no protected snapshot (clone format 2).
		"rbd_default_clone_format": "2",
	}
}

// Connect connects to the cluster. It is bounded by the timeout: a cluster
// whose monitors do not answer gives ErrTimeout.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	id := cfg.ID
	if id == "" {
		id = "admin"
	}
	conn, err := rados.NewConnWithUser(id)
	if err != nil {
		return nil, wrap("connect", "", err)
	}
	if cfg.ConfFile != "" {
		err = conn.ReadConfigFile(cfg.ConfFile)
	} else {
		err = conn.ReadDefaultConfigFile()
	}
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("rbd: reading ceph config %q: %w", cfg.ConfFile, wrap("config", "", err))
	}
	for _, opts := range []map[string]string{settings(cfg.Timeout), cfg.Options} {
		for k, v := range opts {
			if err := conn.SetConfigOption(k, v); err != nil {
				conn.Shutdown()
				return nil, fmt.Errorf("rbd: setting %s=%s: %w", k, v, wrap("config", "", err))
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- conn.Connect() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Connect is bounded by client_mount_timeout; shut down once it ends.
		go func() {
			if <-done == nil {
				conn.Shutdown()
			}
		}()
		return nil, fmt.Errorf("rbd: connecting: %w", ctx.Err())
	}
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("rbd: connecting with %q as client.%s: %w", cfg.ConfFile, id, wrap("connect", "", err))
	}
	return &Conn{conn: conn, timeout: cfg.Timeout}, nil
}

// Timeout is the per-operation timeout the connection was configured with.
func (c *Conn) Timeout() time.Duration { return c.timeout }

// InstanceID is this client's instance id (the cluster's global id of the
// connection, "client.N" in lock owners and the blocklist).
func (c *Conn) InstanceID() uint64 { return c.conn.GetInstanceID() }

// WaitForLatestOSDMap waits until this client has the cluster's current
// OSD map (flags such as pause or full included).
func (c *Conn) WaitForLatestOSDMap() error {
	return wrap("wait for osd map", "", c.conn.WaitForLatestOSDMap())
}

// Close shuts the connection down. Images opened through it must be closed
// first.
func (c *Conn) Close() { c.conn.Shutdown() }

// Pool is a pool, or a RADOS namespace within one: the unit a store maps to.
type Pool struct {
	conn  *Conn
	ioctx *rados.IOContext
	spec  string // "pool" or "pool/ns"
	ns    string
}

// ParsePoolSpec splits "POOL[/NAMESPACE]".
func ParsePoolSpec(spec string) (pool, ns string, err error) {
	pool, ns, _ = strings.Cut(spec, "/")
	if pool == "" || strings.Contains(ns, "/") || strings.HasSuffix(spec, "/") {
		return "", "", fmt.Errorf("rbd: pool %q: want POOL or POOL/NAMESPACE", spec)
	}
	return pool, ns, nil
}

// OpenPool opens "POOL[/NAMESPACE]". The pool must exist (ErrNotFound); a
// missing namespace is created when create is set, ErrNotFound otherwise.
func (c *Conn) OpenPool(spec string, create bool) (*Pool, error) {
	name, ns, err := ParsePoolSpec(spec)
	if err != nil {
		return nil, err
	}
	ioctx, err := c.conn.OpenIOContext(name)
	if err != nil {
		return nil, wrap("open pool", name, err)
	}
	p := &Pool{conn: c, ioctx: ioctx, spec: spec, ns: ns}
	if ns != "" {
		ok, err := rbd.NamespaceExists(ioctx, ns)
		if err != nil {
			ioctx.Destroy()
			return nil, wrap("namespace exists", spec, err)
		}
		if !ok {
			if !create {
				ioctx.Destroy()
				return nil, &Error{Op: "open namespace", Image: spec, Errno: 2, Err: ErrNotFound}
			}
			if err := rbd.NamespaceCreate(ioctx, ns); err != nil {
				ioctx.Destroy()
				return nil, wrap("namespace create", spec, err)
			}
		}
		ioctx.SetNamespace(ns)
	}
	return p, nil
}

// Spec is "POOL" or "POOL/NAMESPACE".
func (p *Pool) Spec() string { return p.spec }

// Conn is the connection the pool was opened on.
func (p *Pool) Conn() *Conn { return p.conn }

// Close releases the pool's I/O context.
func (p *Pool) Close() { p.ioctx.Destroy() }

// RemoveNamespace removes the pool's namespace (it must hold no image).
func (p *Pool) RemoveNamespace() error {
	if p.ns == "" {
		return fmt.Errorf("rbd: %s is a pool, not a namespace", p.spec)
	}
	name, _, _ := strings.Cut(p.spec, "/")
	ioctx, err := p.conn.conn.OpenIOContext(name)
	if err != nil {
		return wrap("open pool", name, err)
	}
	defer ioctx.Destroy()
	return wrap("namespace remove", p.spec, rbd.NamespaceRemove(ioctx, p.ns))
}

func (p *Pool) where(image string) string { return p.spec + "/" + image }

// FSID is the cluster's fsid.
func (c *Conn) FSID() (string, error) {
	id, err := c.conn.GetFSID()
	return id, wrap("fsid", "", err)
}

// MonCommand sends a command to the monitors (JSON, as the ceph CLI
// builds it: {"prefix": "osd set-full-ratio", "ratio": 0.95}) and returns
// its output and status text.
func (c *Conn) MonCommand(cmd map[string]any) (out []byte, status string, err error) {
	b, err := json.Marshal(cmd)
	if err != nil {
		return nil, "", err
	}
	out, status, err = c.conn.MonCommand(b)
	if err != nil {
		return out, status, fmt.Errorf("%w: %s", wrap("mon command "+string(b), "", err), status)
	}
	return out, status, nil
}
