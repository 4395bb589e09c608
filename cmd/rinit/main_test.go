package main

import (
	"testing"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
)

// TestFlagsHaveEnvVars: every flag of every rinit command can also be set by
// a RINIT_* environment variable.
func TestFlagsHaveEnvVars(t *testing.T) {
	for _, bad := range clix.CheckEnvVars(newApp(), "RINIT_") {
		t.Error(bad)
	}
}
