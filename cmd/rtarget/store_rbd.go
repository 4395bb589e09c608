//go:build ceph

package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/store"
)

func init() {
	registerStore(storeKind{
		name: "rbd",
		usage: "a gateway in front of Ceph RBD: volumes are the images of --rbd-pool POOL[/NAMESPACE] " +
			"(serving one takes its exclusive lock, fencing any other gateway that held it)",
		flags: func() []cli.Flag {
			return []cli.Flag{
				&cli.StringFlag{Name: "ceph-conf", Value: "/etc/ceph/ceph.conf", Usage: "rbd: the Ceph config file",
					EnvVars: []string{"RTARGET_CEPH_CONF"}},
				&cli.StringFlag{Name: "ceph-id", Value: "admin", Usage: "rbd: the Ceph client name, without \"client.\" " +
					"(its keyring is found as the config says)", EnvVars: []string{"RTARGET_CEPH_ID"}},
				&cli.StringFlag{Name: "rbd-pool", Value: "rbd", Usage: "rbd: the store, POOL or POOL/NAMESPACE (the pool must exist " +
					"and be initialised for RBD: rbd pool init POOL; a missing namespace is created)", EnvVars: []string{"RTARGET_RBD_POOL"}},
				&cli.DurationFlag{Name: "ceph-timeout", Value: store.DefaultRBDTimeout, Usage: "rbd: bound on a block request: " +
					"a full or unreachable cluster fails I/O with an error within it instead of hanging (each cluster operation gets " +
					"half: rados_osd_op_timeout; keep that above the cluster's osd_heartbeat_grace + osd_heartbeat_interval)",
					EnvVars: []string{"RTARGET_CEPH_TIMEOUT"}},
			}
		},
		open: func(c *cli.Context, log *slog.Logger, _ bool) (store.Store, error) {
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("ceph-timeout")+5*time.Second)
			defer cancel()
			st, err := store.OpenRBD(ctx, store.RBDOptions{ConfFile: c.String("ceph-conf"), ID: c.String("ceph-id"),
				Pool: c.String("rbd-pool"), Timeout: c.Duration("ceph-timeout"), Logger: log})
			if err != nil {
				return nil, fmt.Errorf("open rbd store %s: %w", c.String("rbd-pool"), err)
			}
			return st, nil
		},
		control: func(*cli.Context) string { return "" },
	})
}
