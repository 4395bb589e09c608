package main

import (
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/store"
)

func init() {
	registerStore(storeKind{
		name:  "memory",
		usage: "volumes in memory, lost on exit (for tests and benchmarks)",
		open: func(*cli.Context, *slog.Logger, bool) (store.Store, error) {
			return store.NewMemory(), nil
		},
		control: func(*cli.Context) string { return "" },
	})
}
