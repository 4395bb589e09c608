package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/store"
)

// storeKind is a store backend the command line can open. The kinds are
// registered by the store_*.go files of this command, some behind build tags
// (the Ceph build adds rbd), so that adding one changes no other file.
type storeKind struct {
	name  string
	usage string // one line for --store's help
	// flags returns new instances of the backend's own flags; serve and
	// every volume command take them.
	flags func() []cli.Flag
	// open opens the store; serving is true for rtarget serve (which may
	// tune the store for a long-running daemon).
	open func(c *cli.Context, log *slog.Logger, serving bool) (store.Store, error)
	// control returns the path of the control socket a daemon serving this
	// store listens on, "" for none.
	control func(c *cli.Context) string
	// isDefault marks the kind --store defaults to.
	isDefault bool
}

// storeKinds are the registered kinds, in registration order (init of the
// store_*.go files).
var storeKinds []storeKind

func registerStore(k storeKind) { storeKinds = append(storeKinds, k) }

func findStore(name string) (storeKind, error) {
	for _, k := range storeKinds {
		if k.name == name {
			return k, nil
		}
	}
	return storeKind{}, fmt.Errorf("--store %q: want %s", name, strings.Join(storeNames(), " or "))
}

func storeNames() []string {
	var names []string
	for _, k := range storeKinds {
		names = append(names, k.name)
	}
	return names
}

func defaultStore() string {
	for _, k := range storeKinds {
		if k.isDefault {
			return k.name
		}
	}
	return storeKinds[0].name
}

// storeFlags are --data, --store and the flags of every registered kind.
func storeFlags() []cli.Flag {
	var usage []string
	for _, k := range storeKinds {
		usage = append(usage, k.name+": "+k.usage)
	}
	flags := []cli.Flag{
		&cli.StringFlag{Name: "data", Value: "./rtarget-data", Usage: "store directory", EnvVars: []string{"RTARGET_DATA"}},
		&cli.StringFlag{Name: "store", Value: defaultStore(), Usage: "store backend: " + strings.Join(usage, "; "),
			EnvVars: []string{"RTARGET_STORE"}},
	}
	seen := map[string]bool{}
	for _, k := range storeKinds {
		if k.flags == nil {
			continue
		}
		for _, f := range k.flags() {
			if name := f.Names()[0]; !seen[name] {
				seen[name] = true
				flags = append(flags, f)
			}
		}
	}
	return slices.Clip(flags)
}

// openStore opens the store --store names.
func openStore(c *cli.Context, log *slog.Logger, serving bool) (store.Store, error) {
	k, err := findStore(c.String("store"))
	if err != nil {
		return nil, err
	}
	return k.open(c, log, serving)
}
