package store

import (
	"context"
	"testing"
)

// TestInMemory: a memory store's volumes say they only copy memory (the
// front ends then run their requests in the completion loop); a thin
// store's do not.
func TestInMemory(t *testing.T) {
	ctx := context.Background()
	b, err := OpenThin(t.TempDir(), ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		name string
		st   Store
		want bool
	}{{"memory", NewMemory(), true}, {"thin", b, false}} {
		if _, err := c.st.CreateVolume(ctx, "v", 1<<20, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		v, err := c.st.OpenVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		if got := v.InMemory(); got != c.want {
			t.Errorf("%s: InMemory() = %v", c.name, got)
		}
		v.Close()
	}
}
