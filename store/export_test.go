package store

import (
	"context"
	"testing"
)

// CheckThin fails t if the thin store s breaks one of its invariants (see
// thinBackend.check).
func CheckThin(t *testing.T, s Store) {
	t.Helper()
	if err := s.(*volumeStore).be.(*thinBackend).check(context.Background()); err != nil {
		t.Fatalf("thin store check: %v", err)
	}
}
