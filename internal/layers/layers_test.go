package layers

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// layer places the packages whose path (relative to the module) is pkg or
// lies under it; the longest matching pkg wins.
type layer struct {
	pkg  string
	rank int // a package imports only packages of lower rank (or of its own layer)
	// rdmaFree: nothing of RDMA (the storage side, the VM builder): it may
	// import rnic/crc32c and other rdmaFree packages, nothing else of the
	// module.
	rdmaFree bool
	// testOnly: imported by test files alone.
	testOnly bool
}

var layers = []layer{
	{pkg: "rnic/crc32c", rank: 0},
	{pkg: "rnic/term", rank: 0},
	{pkg: "rnic/mpa", rank: 10},
	{pkg: "internal/wiretest", rank: 10, testOnly: true}, // tshark and pcap helpers; imports rnic/term
	{pkg: "rnic/ddp", rank: 20},
	{pkg: "rnic/rdmap", rank: 30},
	{pkg: "internal/rawpeer", rank: 35, testOnly: true}, // a hand-driven wire peer: mpa, ddp, rdmap
	{pkg: "rnic", rank: 40},
	{pkg: "blockproto", rank: 50},
	{pkg: "internal/rping", rank: 50},    // an application of the engine
	{pkg: "internal/perftest", rank: 50}, // an application of the engine
	{pkg: "internal/endpoint", rank: 55}, // the message endpoint both ends of the block protocol share
	{pkg: "target", rank: 60},
	{pkg: "target/nvmf", rank: 65}, // the NVMe/RDMA front end: on target's volumes and lock tables
	{pkg: "initiator", rank: 60},
	{pkg: "internal/interop", rank: 60, testOnly: true}, // the engine against Linux siw: rping, perftest, linuxvm
	{pkg: "cmd/internal/clix", rank: 60},
	{pkg: "cmd", rank: 70},
	{pkg: "bench", rank: 70},
	{pkg: "internal/benchkit", rank: 65}, // fio, processes and ports for the commands of bench/
	{pkg: "internal/layers", rank: 80, testOnly: true},

	{pkg: "store", rank: 5, rdmaFree: true},
	{pkg: "store/storetest", rank: 5, rdmaFree: true, testOnly: true},
	{pkg: "store/rbdtest", rank: 60, testOnly: true},                    // the rbd backend under real targets and initiators
	{pkg: "internal/rbd", rank: 3, rdmaFree: true},                      // the Ceph RBD client store builds its rbd backend on
	{pkg: "internal/cephtest", rank: 3, rdmaFree: true, testOnly: true}, // a Ceph cluster for rbd's tests
	{pkg: "internal/linuxvm", rank: 0, rdmaFree: true, testOnly: true},  // builds and boots the Linux peer VM: nothing of RDMA
	{pkg: "internal/loopfs", rank: 0, rdmaFree: true, testOnly: true},   // a small file system of a test's own
	{pkg: "internal/gobuild", rank: 0, rdmaFree: true},                  // go build of the commands for tests that run them as processes
	{pkg: "internal/vmmem", rank: 0, rdmaFree: true},                    // a VM's memory as a long-running host's, for benchmarks
	{pkg: "internal/sockio", rank: 0, rdmaFree: true},                   // the data path's socket system calls (rnic, initiator/nbd)
	{pkg: "internal/childproc", rank: 0, rdmaFree: true},                // daemons that die with the test or runner that started them
}

// place returns the layer of package p (a path relative to the module).
func place(p string) (layer, bool) {
	best, found := layer{}, false
	for _, l := range layers {
		if (p == l.pkg || strings.HasPrefix(p, l.pkg+"/")) && (!found || len(l.pkg) > len(best.pkg)) {
			best, found = l, true
		}
	}
	return best, found
}

// check returns why package from may not import package to (both relative
// to the module), or nil. test: the import is in a test file.
func check(from, to string, test bool) error {
	lf, ok := place(from)
	if !ok {
		return fmt.Errorf("package %s has no place in the layer table (internal/layers/layers_test.go)", from)
	}
	lt, ok := place(to)
	if !ok {
		return fmt.Errorf("package %s has no place in the layer table (internal/layers/layers_test.go)", to)
	}
	switch {
	case lt.testOnly && !test:
		return fmt.Errorf("%s imports %s, which is for tests only", from, to)
	case lf.rdmaFree && !lt.rdmaFree && lt.pkg != "rnic/crc32c":
		return fmt.Errorf("%s imports %s: it may use rnic/crc32c and nothing else of RDMA", from, to)
	case lf.pkg == lt.pkg:
		return nil // within one layer entry (a package and its sub-packages)
	case lt.rank < lf.rank:
		return nil
	case lt.rank == lf.rank && lf.testOnly:
		return nil // a test helper sits at the level of what it serves (store/storetest uses store)
	case test && lt.rank == lf.rank:
		return nil // a test may use its neighbours (initiator's tests run a real target)
	case test && lf.testOnly:
		return nil // the tests of test helpers exercise what they help test (wiretest: ddp and rdmap under tshark)
	}
	return fmt.Errorf("%s (rank %d) imports %s (rank %d): imports go down the layers only", from, lf.rank, to, lt.rank)
}

// moduleRoot returns the directory of go.mod and the module path.
func moduleRoot(t *testing.T) (string, string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if rest, ok := strings.CutPrefix(line, "module "); ok {
					return dir, strings.TrimSpace(rest)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

type edge struct {
	from, to string
	test     bool
	file     string
}

// imports parses the imports of every Go file of the module, whatever its
// build constraints, and returns those of the module's own packages.
func imports(t *testing.T) ([]edge, map[string]bool) {
	root, mod := moduleRoot(t)
	var edges []edge
	pkgs := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		from := filepath.ToSlash(rel)
		pkgs[from] = true
		for _, spec := range f.Imports {
			p, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			if to, ok := strings.CutPrefix(p, mod+"/"); ok {
				edges = append(edges, edge{from, to, strings.HasSuffix(name, "_test.go"), filepath.Join(rel, name)})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return edges, pkgs
}

// TestLayerOrder checks every import between the module's packages.
func TestLayerOrder(t *testing.T) {
	edges, pkgs := imports(t)
	if len(edges) < 50 || !pkgs["rnic"] || !pkgs["rnic/mpa"] || !pkgs["target"] {
		t.Fatalf("found %d imports in %d packages: the walk missed the module", len(edges), len(pkgs))
	}
	var names []string
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if p == "." {
			continue
		}
		if _, ok := place(p); !ok {
			t.Errorf("package %s has no place in the layer table", p)
		}
	}
	for _, e := range edges {
		if err := check(e.from, e.to, e.test); err != nil {
			t.Errorf("%s: %v", e.file, err)
		}
	}
}

// TestCheckRefuses: the order is enforced, not just written down: each
// import below breaks it and is refused; the ones after it are allowed.
func TestCheckRefuses(t *testing.T) {
	for _, e := range []edge{
		{from: "rnic/crc32c", to: "rnic/mpa"},
		{from: "rnic/mpa", to: "rnic/ddp"},
		{from: "rnic/ddp", to: "rnic/rdmap"},
		{from: "rnic/rdmap", to: "rnic"},
		{from: "rnic", to: "blockproto"},
		{from: "rnic", to: "internal/rping"},
		{from: "blockproto", to: "target"},
		{from: "target", to: "initiator"},
		{from: "initiator", to: "target"},
		{from: "initiator/nbd", to: "cmd/rinit"},
		{from: "target", to: "cmd/internal/clix"},
		{from: "store", to: "rnic/mpa"},
		{from: "store", to: "rnic/term"},
		{from: "internal/rbd", to: "rnic"},
		{from: "store", to: "blockproto", test: true},
		{from: "rnic", to: "internal/rawpeer"}, // test-only, from a non-test file
		{from: "target", to: "store/storetest"},
		{from: "internal/rbd", to: "store"},
		{from: "rnic/mpa", to: "internal/wiretest"},
		{from: "rnic/mpa", to: "rnic", test: true},
		{from: "target", to: "cmd/rtarget", test: true},
		{from: "rnic/newthing", to: "rnic/mpa"}, // under rnic: placed with it
		{from: "internal/unplaced", to: "rnic"},
	} {
		err := check(e.from, e.to, e.test)
		if e.from == "rnic/newthing" {
			if err != nil {
				t.Errorf("%s -> %s: %v (a sub-package is placed with its parent)", e.from, e.to, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s -> %s (test %v) allowed", e.from, e.to, e.test)
		}
	}
	for _, e := range []edge{
		{from: "store", to: "rnic/crc32c"},
		{from: "target", to: "store"},
		{from: "initiator", to: "target", test: true},
		{from: "rnic", to: "internal/rawpeer", test: true},
		{from: "rnic/mpa", to: "internal/wiretest", test: true},
		{from: "cmd/rinit", to: "initiator/nbd"},
		{from: "cmd/rinit", to: "cmd/internal/clix"},
		{from: "internal/interop", to: "internal/rping"},
		{from: "store/storetest", to: "store"},
		{from: "internal/rbd", to: "internal/cephtest", test: true},
		{from: "internal/cephtest", to: "internal/rbd"},
		{from: "internal/wiretest", to: "rnic/rdmap", test: true},
	} {
		if err := check(e.from, e.to, e.test); err != nil {
			t.Errorf("%s -> %s (test %v): %v", e.from, e.to, e.test, err)
		}
	}
}
