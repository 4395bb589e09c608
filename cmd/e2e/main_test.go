//go:build !ceph

package e2e

import (
	"os"
	"testing"
)

// TestMain of the build without Ceph (rbd_test.go has the other).
func TestMain(m *testing.M) {
	code := m.Run()
	removeBins()
	os.Exit(code)
}
