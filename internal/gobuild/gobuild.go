// Package gobuild builds this module's commands for the tests that run
// them as processes (cmd/e2e, bench/nvmf).
//
// go test caches a passing result under the test binary and the files and
// environment variables the test process consulted. A binary that a child
// `go build` makes from the module's sources is none of those: without
// more, a test that runs rtarget as a process would report its cached pass
// after rtarget's code changed (make test on a developer's machine showed
// cmd/e2e as cached after a change to store). Build therefore stats every
// file of the module outside testdata and dot directories, and lists every
// directory, before it builds: the result stays cached only while none of
// them changed.
package gobuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build runs `go build args...` with env added to the environment, and
// returns its combined output.
func Build(env []string, args ...string) ([]byte, error) {
	if err := consultSources(); err != nil {
		return nil, fmt.Errorf("go build %s: %w", strings.Join(args, " "), err)
	}
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("go build %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// consultSources stats every file of the module that a build may read.
func consultSources() error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if _, err := os.Stat(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("module sources: %w", err)
		}
		return nil
	})
}

// ModuleRoot returns the directory of the go.mod at or above the working
// directory (a test's is its package's).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("module root: no go.mod at or above the working directory")
		}
		dir = parent
	}
}
