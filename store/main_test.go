package store_test

import (
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/rnic-dev/rnic/internal/vmmem"
)

// TestMain: with RNIC_STEADY_MEMORY=1 the run first stops the VM's free
// page reporting and writes once to the free memory (vmmem.SteadyMemory),
// so that the benchmarks that grow the page cache (fresh volumes, copy on
// write) measure the store and not the host's fault on each new page. It
// needs root; the tests themselves never depend on it.
func TestMain(m *testing.M) {
	restore := func() {}
	if os.Getenv("RNIC_STEADY_MEMORY") == "1" {
		r, err := vmmem.SteadyMemory(1<<30, slog.Default())
		if err != nil {
			fmt.Fprintln(os.Stderr, "RNIC_STEADY_MEMORY:", err)
			os.Exit(2)
		}
		restore = r
	}
	code := m.Run()
	restore()
	os.Exit(code)
}
