package linuxvm

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// scripts are the builder and the files it puts into the VM; Ensure writes
// them into the cache directory so the package works from any test binary.
//
//go:embed build.sh init.sh run-vm.sh
var scripts embed.FS

// CacheEnv names the environment variable that overrides DefaultCacheDir.
const CacheEnv = "RNIC_VM_CACHE"

// DefaultCacheDir is $RNIC_VM_CACHE, or rnic/linuxvm under the user cache
// directory (for root: /root/.cache/rnic/linuxvm).
func DefaultCacheDir() (string, error) {
	if d := os.Getenv(CacheEnv); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("linuxvm: no cache dir (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(d, "rnic", "linuxvm"), nil
}

// writeScripts copies the embedded scripts to cacheDir/scripts and returns
// the path of build.sh there.
func writeScripts(cacheDir string) (string, error) {
	dir := filepath.Join(cacheDir, "scripts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("linuxvm: %w", err)
	}
	for _, name := range []string{"build.sh", "init.sh", "run-vm.sh"} {
		b, err := scripts.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("linuxvm: embedded %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			return "", fmt.Errorf("linuxvm: write %s: %w", name, err)
		}
	}
	return filepath.Join(dir, "build.sh"), nil
}

// Ensure builds the VM into cacheDir unless it is already up to date. It
// installs Debian packages with apt-get when some are missing, so a first
// build needs root. Build progress goes to log (may be nil).
func Ensure(ctx context.Context, cacheDir string, log io.Writer) error {
	build, err := writeScripts(cacheDir)
	if err != nil {
		return err
	}
	if log == nil {
		log = io.Discard
	}
	var tail bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", build, cacheDir)
	cmd.Stdout = io.MultiWriter(log, &tail)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("linuxvm: build.sh %s: %w\n%s", cacheDir, err, lastBytes(tail.Bytes(), 4096))
	}
	return nil
}

// ErrNotBuilt reports that the cache directory holds no up-to-date VM.
var ErrNotBuilt = errors.New("linuxvm: VM not built or out of date")

// Built reports whether cacheDir holds a VM that matches its inputs, without
// building or installing anything. It returns ErrNotBuilt when it does not.
func Built(ctx context.Context, cacheDir string) error {
	for _, f := range []string{"vmlinuz", "initrd.gz", "run-vm.sh", "stamp"} {
		if _, err := os.Stat(filepath.Join(cacheDir, f)); err != nil {
			return fmt.Errorf("%w: %s", ErrNotBuilt, err)
		}
	}
	build, err := writeScripts(cacheDir)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "bash", build, "--check", cacheDir).CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			return fmt.Errorf("%w: %s", ErrNotBuilt, bytes.TrimSpace(out))
		}
		return fmt.Errorf("linuxvm: build.sh --check: %w: %s", err, out)
	}
	return nil
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
