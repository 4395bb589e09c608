package store_test

import (
	"testing"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{Open: func(*testing.T) store.Store { return store.NewMemory() }})
}

func TestBadgerConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{
		Open: func(t *testing.T) store.Store {
			s, err := store.OpenBadger(t.TempDir(), store.BadgerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		NoSnapshots: true,
		NoResize:    true,
	})
}
