package main

import (
	"testing"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
)

// TestFlagsHaveEnvVars: every flag of every rtarget command can also be set
// by an RTARGET_* environment variable.
func TestFlagsHaveEnvVars(t *testing.T) {
	for _, bad := range clix.CheckEnvVars(newApp(), "RTARGET_") {
		t.Error(bad)
	}
}
