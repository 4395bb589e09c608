package main

import (
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
)

func init() {
	registerStore(storeKind{
		name:  "badger",
		usage: "one badger value per block, in --data",
		flags: func() []cli.Flag {
			return []cli.Flag{&cli.StringFlag{Name: "mapped-budget", Value: "96M", Usage: "badger: file-backed memory kept mapped " +
				"before value log pages are taken out of the process (bounds RSS near 256 MiB; 'off' disables: faster random reads, " +
				"RSS grows with the page cache the volume uses)", EnvVars: []string{"RTARGET_MAPPED_BUDGET"}}}
		},
		open: func(c *cli.Context, log *slog.Logger, serving bool) (store.Store, error) {
			opts := store.BadgerOptions{Logger: log}
			if mb := c.String("mapped-budget"); serving && mb != "" {
				if mb == "off" {
					opts.MappedBudget = -1
				} else {
					n, err := clix.ParseSize(mb)
					if err != nil {
						return nil, fmt.Errorf("--mapped-budget: %w", err)
					}
					opts.MappedBudget = n
				}
			}
			st, err := store.OpenBadger(c.String("data"), opts)
			if err != nil {
				return nil, fmt.Errorf("open store %s: %w", c.String("data"), err)
			}
			return st, nil
		},
		control:   func(*cli.Context) string { return "" },
		isDefault: true,
	})
}
