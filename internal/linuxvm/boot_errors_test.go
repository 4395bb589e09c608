package linuxvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestBootRejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	empty := t.TempDir()
	if _, err := Boot(ctx, Config{CacheDir: empty}); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("empty cache: got %v, want ErrNotBuilt", err)
	}
	if err := Built(ctx, empty); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Built(empty): got %v, want ErrNotBuilt", err)
	}
	// A cache with a run script but a bad config must fail before starting anything.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run-vm.sh"), []byte("#!/bin/sh\nexit 99\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Boot(ctx, Config{CacheDir: dir, Variant: "rev3"}); err == nil {
		t.Fatal("unknown variant accepted")
	}
	if _, err := Boot(ctx, Config{CacheDir: dir, Forwards: []int{70000}}); err == nil {
		t.Fatal("port 70000 accepted")
	}
}

func TestExitError(t *testing.T) {
	var err error = &ExitError{Code: 3}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 || err.Error() != "linuxvm: guest script exited 3" {
		t.Fatalf("ExitError: %v", err)
	}
}
