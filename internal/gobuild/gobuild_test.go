package gobuild

import (
	"os"
	"path/filepath"
	"testing"
)

// TestModuleRoot: the root is found from a package directory below it,
// and a directory with no go.mod above it is an error.
func TestModuleRoot(t *testing.T) {
	root := t.TempDir()
	pkg := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(pkg)
	got, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := filepath.EvalSymlinks(root); got != root && got != want {
		t.Fatalf("module root %q, want %q", got, root)
	}
	t.Chdir("/")
	if _, err := ModuleRoot(); err == nil {
		t.Fatal("no go.mod at or above /: want an error")
	}
}

// TestBuild: Build walks a module with files go would not build (in
// testdata and dot directories, which it skips) and builds its command; a
// build that fails returns the compiler's output and an error. (That the
// walk makes go test's cache depend on the files was checked by hand: a
// change to store/doc.go made cmd/e2e run again instead of "(cached)".)
func TestBuild(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"go.mod":                "module example.com/m\n\ngo 1.22\n",
		"cmd/hello/main.go":     "package main\n\nfunc main() {}\n",
		"testdata/skip/x.go":    "this is not Go: testdata is not walked\n",
		".hidden/skip/x.go":     "nor are dot directories\n",
		"cmd/broken/main.go":    "package main\n\nfunc main() { undefined() }\n",
		"internal/lib/notes.md": "any file counts\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(filepath.Join(root, "cmd", "hello"))
	if err := consultSources(); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "hello")
	if out, err := Build([]string{"GOFLAGS=-mod=mod", "GOWORK=off"}, "-o", bin, "."); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("built binary: %v", err)
	}
	out, err := Build([]string{"GOWORK=off"}, "-o", filepath.Join(t.TempDir(), "broken"), "example.com/m/cmd/broken")
	if err == nil || len(out) == 0 {
		t.Fatalf("a build that fails: err %v, output %q", err, out)
	}
}
