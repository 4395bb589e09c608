package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/internal/perftest"
	"github.com/rnic-dev/rnic/rnic"
)

func perftestCommand() *cli.Command {
	return &cli.Command{
		Name:      "perftest",
		Usage:     "serve one linux-rdma perftest client (ib_write_bw, ib_read_bw, ib_send_bw with -R)",
		UsageText: "rinit perftest --test write|read|send [-a ADDR] [-p PORT]",
		Description: "A server for perftest's bandwidth tests over rdma_cm (-R), for interoperability checks:\n" +
			"run e.g. `ib_write_bw -R -n 100 -s 4096 -p 18515 HOST` on the client. It exits 0 when the client ran\n" +
			"its test to the end and closed the connection.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "test", Value: "write", Usage: "the client's test: write, read or send", EnvVars: []string{"RINIT_PERFTEST_TEST"}},
			&cli.StringFlag{Name: "a", Usage: "`ADDR` to listen on (default all)", EnvVars: []string{"RINIT_PERFTEST_ADDR"}},
			&cli.IntFlag{Name: "p", Value: perftest.DefaultPort, Usage: "`PORT`", EnvVars: []string{"RINIT_PERFTEST_PORT"}},
			&cli.IntFlag{Name: "s", Value: 65536, Usage: "largest message `SIZE` the client will use", EnvVars: []string{"RINIT_PERFTEST_SIZE"}},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Minute, Usage: "give up after this long", EnvVars: []string{"RINIT_PERFTEST_TIMEOUT"}},
		}, clix.LogFlags("RINIT_")...),
		Action: func(c *cli.Context) error {
			log, err := clix.Logger(c, os.Stderr)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
			defer cancel()
			cfg := rnic.DefaultConfig()
			cfg.Name = "perftest"
			cfg.Logger = log
			dev, err := rnic.Open(cfg)
			if err != nil {
				return err
			}
			defer dev.Close()
			ln, err := dev.Listen(net.JoinHostPort(c.String("a"), strconv.Itoa(c.Int("p"))))
			if err != nil {
				return err
			}
			defer ln.Close()
			st, err := perftest.Serve(ctx, dev, ln, perftest.Options{Test: perftest.Test(c.String("test")), MaxSize: c.Int("s"), Logger: log})
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "perftest %s: client done; %d comm messages answered, data connection %v, %d sends received (%d bytes), %d credit writes\n",
				c.String("test"), st.CommMessages, st.DataConn, st.Received, st.Bytes, st.Credits)
			return nil
		},
	}
}
