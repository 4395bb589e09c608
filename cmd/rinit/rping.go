package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/internal/rping"
	"github.com/rnic-dev/rnic/rnic"
)

func rpingCommand() *cli.Command {
	return &cli.Command{
		Name:      "rping",
		Usage:     "ping an iWARP peer with rdma-core's rping exchange (either role)",
		UsageText: "rinit rping -s [-a ADDR] [-p PORT] [-S SIZE] [-C COUNT] [-v]\n   rinit rping -c -a ADDR [-p PORT] [-S SIZE] [-C COUNT] [-v]",
		Description: "Speaks the exchange of rdma-core's rping, so it works against Linux rping over siw or a hardware\n" +
			"iWARP RNIC: the client advertises its buffers with Sends, the server RDMA Reads the ping data and\n" +
			"RDMA Writes it back. Unlike rping, the exit status is 0 only when every ping moved and verified\n" +
			"its data (the server checks rping's data pattern, the client compares the echo).\n\n" +
			"A Linux rping server over MPA revision 1 (siw built with mpa_version=1) needs -q: without it\n" +
			"rdma_accept leaves it ORD 0 and its first RDMA Read fails.",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "s", Usage: "server: wait for a client, answer its pings, exit when it disconnects",
				EnvVars: []string{"RINIT_RPING_SERVER"}},
			&cli.BoolFlag{Name: "c", Usage: "client: ping the server at -a", EnvVars: []string{"RINIT_RPING_CLIENT"}},
			&cli.StringFlag{Name: "a", Usage: "`ADDR`: the server's address (client) or the address to listen on (server, default all)",
				EnvVars: []string{"RINIT_RPING_ADDR"}},
			&cli.IntFlag{Name: "p", Value: rping.DefaultPort, Usage: "`PORT`", EnvVars: []string{"RINIT_RPING_PORT"}},
			&cli.IntFlag{Name: "C", Value: 0, Usage: "`COUNT` of pings (client default 1; server: require exactly COUNT, default any)",
				EnvVars: []string{"RINIT_RPING_COUNT"}},
			&cli.IntFlag{Name: "S", Value: rping.DefaultSize, Usage: fmt.Sprintf("`SIZE` of a ping in bytes (%d..%d; the server's is the largest it accepts)", rping.MinSize, rping.MaxSize),
				EnvVars: []string{"RINIT_RPING_SIZE"}},
			&cli.BoolFlag{Name: "v", Usage: "print each ping's data", EnvVars: []string{"RINIT_RPING_VERBOSE"}},
			&cli.BoolFlag{Name: "V", Usage: "validate the data (always done; accepted for rping compatibility)",
				EnvVars: []string{"RINIT_RPING_VALIDATE"}},
			&cli.BoolFlag{Name: "q", Usage: "accepted for rping compatibility (rping's self-managed QP; no effect here)",
				EnvVars: []string{"RINIT_RPING_SELF_QP"}},
			&cli.IntFlag{Name: "mpa-rev", Value: 2, Usage: "MPA revision to ask for as the client (1 or 2)", EnvVars: []string{"RINIT_MPA_REV"}},
			&cli.BoolFlag{Name: "crc", Usage: "ask for MPA CRCs (a peer that asks gets them anyway)", EnvVars: []string{"RINIT_CRC"}},
			&cli.DurationFlag{Name: "settle", Value: 300 * time.Millisecond, Usage: "client: pause after the MPA Reply before the first ping (Linux siw's accept race; 0: none)",
				EnvVars: []string{"RINIT_RPING_SETTLE"}},
			// Not RINIT_TIMEOUT: that is the login timeout of the volume
			// commands, with another default.
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "give up after this long", EnvVars: []string{"RINIT_RPING_TIMEOUT"}},
		}, clix.LogFlags("RINIT_")...),
		Action: runRping,
	}
}

func runRping(c *cli.Context) error {
	if c.Bool("s") == c.Bool("c") {
		return errors.New("rping: give exactly one of -s (server) and -c (client)")
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	settle := c.Duration("settle")
	if settle == 0 {
		settle = -1
	}
	o := rping.Options{Size: c.Int("S"), Count: c.Int("C"), Logger: log, Rev: c.Int("mpa-rev"), CRC: c.Bool("crc"), Settle: settle}
	if c.Bool("v") {
		o.Verbose = c.App.Writer
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
	defer cancel()
	cfg := rnic.DefaultConfig()
	cfg.Name = "rping"
	cfg.Logger = log
	dev, err := rnic.Open(cfg)
	if err != nil {
		return err
	}
	defer dev.Close()
	port := strconv.Itoa(c.Int("p"))
	if c.Bool("c") {
		if c.String("a") == "" {
			return errors.New("rping: the client needs the server's address (-a)")
		}
		st, err := rping.Client(ctx, dev, net.JoinHostPort(c.String("a"), port), o)
		if err != nil {
			return fmt.Errorf("rping client: %d pings verified, then: %w", st.Pings, err)
		}
		fmt.Fprintf(c.App.ErrWriter, "rping client: %d pings of %d bytes verified in %v (MPA rev %d, CRC %v)\n",
			st.Pings, o.Size, st.Duration.Round(time.Millisecond), st.Conn.Rev, st.Conn.CRC)
		return nil
	}
	ln, err := dev.Listen(net.JoinHostPort(c.String("a"), port))
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info("rping server listening", "addr", ln.Addr())
	st, err := rping.Server(ctx, dev, ln, o, true)
	if err != nil {
		return fmt.Errorf("rping server: %d pings verified, then: %w", st.Pings, err)
	}
	fmt.Fprintf(c.App.ErrWriter, "rping server: %d pings verified in %v (MPA rev %d, CRC %v)\n",
		st.Pings, st.Duration.Round(time.Millisecond), st.Conn.Rev, st.Conn.CRC)
	return nil
}
