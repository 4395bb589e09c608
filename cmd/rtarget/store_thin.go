package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
)

func init() {
	registerStore(storeKind{
		name:  "thin",
		usage: "thin volumes with snapshots and clones, data in files in --data, metadata in badger (the default)",
		flags: func() []cli.Flag {
			return []cli.Flag{&cli.StringFlag{Name: "cluster-size", Value: "64K", Usage: "thin: the allocation and copy-on-write " +
				"unit of a new store (4K to 4M, a power of two); an existing store keeps its own",
				EnvVars: []string{"RTARGET_CLUSTER_SIZE"}},
				&cli.StringFlag{Name: "reserve", Value: "auto", Usage: "thin: free space that data writes leave on the " +
					"file system of --data for the metadata; a write that needs more fails with ENOSPC. auto: 2% of the " +
					"file system, at least 64M, at most 1G. Half of it (at most 64M) is held in the file data/ballast, " +
					"given to the metadata if another program fills the file system", EnvVars: []string{"RTARGET_RESERVE"}}}
		},
		open: func(c *cli.Context, log *slog.Logger, _ bool) (store.Store, error) {
			opts, err := thinOptions(c, log)
			if err != nil {
				return nil, err
			}
			st, err := store.OpenThin(c.String("data"), opts)
			if err != nil {
				return nil, fmt.Errorf("open store %s: %w", c.String("data"), err)
			}
			return st, nil
		},
		control:   func(c *cli.Context) string { return filepath.Join(c.String("data"), controlSocketName) },
		isDefault: true,
	})
}

func thinOptions(c *cli.Context, log *slog.Logger) (store.ThinOptions, error) {
	cs, err := clix.ParseSize(c.String("cluster-size"))
	if err != nil {
		return store.ThinOptions{}, fmt.Errorf("--cluster-size: %w", err)
	}
	var reserve int64
	if r := c.String("reserve"); r != "auto" {
		if reserve, err = clix.ParseSize(r); err != nil {
			return store.ThinOptions{}, fmt.Errorf("--reserve: %w", err)
		}
		if reserve <= 0 {
			return store.ThinOptions{}, fmt.Errorf("--reserve %s: give a size above 0, or auto", r)
		}
	}
	return store.ThinOptions{Logger: log, ClusterSize: cs, Reserve: reserve}, nil
}

// controlSocketName is the control socket of rtarget serve in a thin
// store's --data directory.
const controlSocketName = "rtarget.sock"
