// Command rinit is the initiator of the rnic block service: it logs in to an
// rtarget volume over a software iWARP RNIC and exports it to NBD clients
// (qemu, nbdfuse, fio, the Linux nbd driver), or inspects and locks it.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
)

func main() {
	if err := newApp().Run(os.Args); err != nil {
		clix.Exit("rinit", err)
	}
}

// newApp builds the command line: every command, its flags and their
// environment variables (the tests walk it).
func newApp() *cli.App {
	return clix.Setup(&cli.App{
		Name:  "rinit",
		Usage: "use an rtarget volume: export it over NBD, inspect it, lock it",
		Description: "rinit logs in to a volume of an rtarget and moves its data with RDMA Read and Write.\n\n" +
			"Every flag can also be set with an environment variable (RINIT_<FLAG>; most flags of rping and\n" +
			"perftest: RINIT_RPING_<NAME>, RINIT_PERFTEST_<NAME>; each command's --help shows every flag's variable)\n" +
			"and, except for rping and perftest, a config file (--config).",
		HideHelpCommand: true,
		Commands:        []*cli.Command{nbdCommand(), attachCommand(), infoCommand(), lockCommand(), rpingCommand(), perftestCommand()},
	})
}

// sessionFlags are the flags of every command that logs in to a volume.
func sessionFlags() []cli.Flag {
	host, _ := os.Hostname()
	if host == "" {
		host = "rinit"
	}
	fl := []cli.Flag{
		clix.ConfigFlag("RINIT_"),
		&cli.StringFlag{Name: "target", Value: "127.0.0.1:4420", Usage: "rtarget address HOST:PORT; for a volume several gateways serve (rtarget in front of Ceph RBD), " +
			"a list HOST:PORT,HOST:PORT: rinit logs in to the first that accepts and moves to the next when its session is lost", EnvVars: []string{"RINIT_TARGET"}},
		&cli.StringFlag{Name: "volume", Usage: "volume name (required)", EnvVars: []string{"RINIT_VOLUME"}},
		&cli.StringFlag{Name: "secret-file", Usage: "file holding the pre-shared secret (default: the target's insecure default)",
			EnvVars: []string{"RINIT_SECRET_FILE"}},
		&cli.StringFlag{Name: "name", Value: host, Usage: "initiator name shown to the target and to other initiators",
			EnvVars: []string{"RINIT_NAME"}},
		&cli.IntFlag{Name: "qps", Value: 2, Usage: "RNIC queue pairs per session", EnvVars: []string{"RINIT_QPS"}},
		&cli.IntFlag{Name: "queue-depth", Value: 32, Usage: "commands in flight per queue pair", EnvVars: []string{"RINIT_QUEUE_DEPTH"}},
		&cli.DurationFlag{Name: "timeout", Value: 15 * time.Second, Usage: "connect and login timeout; also how long the flush at exit waits for a target that is gone (a second SIGINT or SIGTERM gives up at once)", EnvVars: []string{"RINIT_TIMEOUT"}},
		&cli.DurationFlag{Name: "heartbeat", Value: 2 * time.Second, Usage: "interval of the liveness probe of the target " +
			"(an RDMA atomic its RNIC answers without touching the store); 0 disables it", EnvVars: []string{"RINIT_HEARTBEAT"}},
		&cli.DurationFlag{Name: "heartbeat-timeout", Value: 15 * time.Second, Usage: "a target that answers no probe for this " +
			"long is dropped: rinit reconnects (to the next --target) and replays the requests in flight", EnvVars: []string{"RINIT_HEARTBEAT_TIMEOUT"}},
	}
	return append(fl, clix.LogFlags("RINIT_")...)
}

// heartbeat maps --heartbeat 0 (off) to the Config's negative interval.
func heartbeat(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// connect logs in to the volume the flags name.
func connect(c *cli.Context, log *slog.Logger) (*initiator.Client, error) {
	if c.String("volume") == "" {
		return nil, fmt.Errorf("--volume is required")
	}
	// The initiator takes 0 and below for its defaults: on the command
	// line they are mistakes.
	for _, f := range []string{"qps", "queue-depth"} {
		if n := c.Int(f); n < 1 {
			return nil, fmt.Errorf("--%s %d: want 1 or more", f, n)
		}
	}
	secret, _, err := clix.ReadSecret(c.String("secret-file"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	cl, err := initiator.Connect(ctx, initiator.Config{Addr: c.String("target"), Volume: c.String("volume"),
		Initiator: c.String("name"), Secret: secret, Logger: log, QPs: c.Int("qps"), QueueDepth: c.Int("queue-depth"),
		HeartbeatInterval: heartbeat(c.Duration("heartbeat")), HeartbeatTimeout: c.Duration("heartbeat-timeout")})
	if err != nil {
		return nil, fmt.Errorf("connect %s volume %s: %w", c.String("target"), c.String("volume"), err)
	}
	return cl, nil
}
