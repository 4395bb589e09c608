package store_test

import (
	"testing"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{Open: func(*testing.T) store.Store { return store.NewMemory() }})
}
