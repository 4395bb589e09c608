//go:build ceph

// Package cephtest gives tests of the rbd backend a real Ceph cluster: the
// one RNIC_CEPH_CONF names (make test starts one for all packages), or one
// started for the test binary with the repository's .ci/ceph-cluster and
// stopped (by its pid files) when the binary ends.
package cephtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/gobuild"
	"github.com/rnic-dev/rnic/internal/rbd"
)

// Pool is the pool the cluster script creates and initialises for RBD.
const Pool = "rbd"

// RepoRoot is the directory of the module's go.mod, found from the
// working directory (a package's directory under go test).
func RepoRoot() (string, error) { return gobuild.ModuleRoot() }

// Start returns the config file of a running cluster and a function that
// stops it (a no-op for the cluster of RNIC_CEPH_CONF).
func Start() (conf string, stop func(), err error) {
	if c := os.Getenv("RNIC_CEPH_CONF"); c != "" {
		return c, func() {}, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "rnic-ceph-")
	if err != nil {
		return "", nil, err
	}
	script := filepath.Join(root, ".ci", "ceph-cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, "start", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("cephtest: starting a cluster with %s: %w", script, err)
	}
	conf = strings.TrimSpace(string(out))
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, script, "stop", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cephtest: stopping the cluster in %s: %v: %s\n", dir, err, out)
		}
		os.RemoveAll(dir)
	}
	return conf, stop, nil
}

// Main is a TestMain body: it runs the tests with a cluster whose config
// file it stores in *conf, and returns the exit code.
func Main(m *testing.M, conf *string) int {
	c, stop, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	*conf = c
	return m.Run()
}

// Connect connects to the cluster with a short timeout, closed when the
// test ends.
func Connect(t testing.TB, conf string, timeout time.Duration) *rbd.Conn {
	t.Helper()
	c, err := rbd.Connect(context.Background(), rbd.Config{ConfFile: conf, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Namespace returns "rbd/<fresh namespace>" for one test: its images (with
// their snapshots) and the namespace itself are removed when the test ends.
func Namespace(t testing.TB, conf string, conn *rbd.Conn) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	spec := Pool + "/t" + hex.EncodeToString(b[:])
	p, err := conn.OpenPool(spec, true)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	// The clean-up has its own connection: the test's may be fenced.
	cc, err := rbd.Connect(context.Background(), rbd.Config{ConfFile: conf, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer cc.Close()
		p, err := cc.OpenPool(spec, false)
		if err != nil {
			t.Errorf("cephtest: cleaning up %s: %v", spec, err)
			return
		}
		defer p.Close()
		start := time.Now()
		defer func() {
			if d := time.Since(start); d > 5*time.Second {
				t.Logf("cephtest: cleaning up %s took %v (an image stayed watched)", spec, d.Round(time.Millisecond))
			}
		}()
		if err := Purge(p); err != nil {
			t.Errorf("cephtest: cleaning up %s: %v", spec, err)
			return
		}
		if err := p.RemoveNamespace(); err != nil {
			t.Errorf("cephtest: %v", err)
		}
	})
	return spec
}

// Purge removes every image of the pool (namespace) with its snapshots,
// clones before their parents. An image still watched (its client died
// without closing it, or closed it while the cluster refused writes) is
// retried until the watch expires (osd_client_watch_timeout, 30 s).
func Purge(p *rbd.Pool) error {
	deadline := time.Now().Add(45 * time.Second)
	for round := 0; ; round++ {
		err := purgeOnce(p)
		if err == nil || !errors.Is(err, rbd.ErrBusy) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

func purgeOnce(p *rbd.Pool) error {
	for range 10 {
		names, err := p.List()
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return nil
		}
		var errs []error
		for _, n := range names {
			errs = append(errs, removeImage(p, n))
		}
		if errors.Join(errs...) == nil {
			continue
		}
		if len(errs) == len(names) && !progress(errs) {
			return errors.Join(errs...)
		}
	}
	return errors.New("cephtest: images left after 10 rounds")
}

func progress(errs []error) bool {
	for _, e := range errs {
		if e == nil {
			return true
		}
	}
	return false
}

// removeImage removes an image's snapshots (those without clones) and then
// the image; it fails while clones of it exist.
func removeImage(p *rbd.Pool, name string) error {
	img, err := p.Open(name)
	if err != nil {
		return err
	}
	snaps, err := img.Snapshots()
	if err != nil {
		img.Close()
		return err
	}
	var errs []error
	for _, s := range snaps {
		errs = append(errs, img.RemoveSnapshot(s.Name))
	}
	img.Close()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return p.Remove(name)
}
