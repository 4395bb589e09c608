//go:build ceph

package rbdtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/internal/cephtest"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/store/storetest"
)

var conf string

func TestMain(m *testing.M) { os.Exit(cephtest.Main(m, &conf)) }

// openStore opens an rbd store on pool (namespace) spec, closed at the end.
func openStore(t *testing.T, spec string) store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.OpenRBD(ctx, store.RBDOptions{ConfFile: conf, Pool: spec, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// freshStore is a store on a namespace of its own.
func freshStore(t *testing.T) (store.Store, string) {
	c := cephtest.Connect(t, conf, 20*time.Second)
	spec := cephtest.Namespace(t, conf, c)
	return openStore(t, spec), spec
}

func TestRBDConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{
		Open: func(t *testing.T) store.Store {
			s, _ := freshStore(t)
			return s
		},
	})
}
