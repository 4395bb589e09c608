package linuxvm

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// TestCache returns the cache dir of a usable VM for tests in any package,
// or skips the test. VM tests run when RNIC_VM=1 (building the VM first if
// needed, which needs root and Debian apt), or when the cache already holds
// an up-to-date VM and RNIC_VM is not 0. They never run under -short.
func TestCache(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("VM tests skipped under -short")
	}
	dir, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	switch os.Getenv("RNIC_VM") {
	case "0":
		t.Skip("RNIC_VM=0")
	case "1":
		start := time.Now()
		if err := Ensure(ctx, dir, tbWriter{t}); err != nil {
			t.Fatal(err)
		}
		t.Logf("linuxvm: Ensure(%s) took %v", dir, time.Since(start).Round(time.Millisecond))
	default:
		if err := Built(ctx, dir); err != nil {
			if errors.Is(err, ErrNotBuilt) {
				t.Skipf("no built VM in %s (set RNIC_VM=1 to build and run): %v", dir, err)
			}
			t.Fatal(err)
		}
	}
	return dir
}

type tbWriter struct{ t testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
