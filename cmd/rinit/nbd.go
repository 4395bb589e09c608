package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pojntfx/go-nbd/pkg/client"
	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/initiator/nbd"
)

func nbdCommand() *cli.Command {
	flags := append(sessionFlags(),
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:10809", Usage: "NBD listen address HOST:PORT or unix:PATH",
			EnvVars: []string{"RINIT_LISTEN"}},
		&cli.StringFlag{Name: "export-name", Usage: "NBD export name (default: the volume name; clients asking for \"\" get it too)",
			EnvVars: []string{"RINIT_EXPORT_NAME"}},
		&cli.BoolFlag{Name: "read-only", Usage: "export read-only", EnvVars: []string{"RINIT_READ_ONLY"}},
	)
	return &cli.Command{
		Name:  "nbd",
		Usage: "serve the volume to NBD clients",
		Description: "Logs in to the volume and serves it over the NBD protocol (fixed newstyle) with FLUSH, FUA,\n" +
			"TRIM, WRITE_ZEROES and multi-conn: every NBD connection shares the one session, and a flush\n" +
			"on any of them reaches the target's store sync. Try: nbdinfo nbd://127.0.0.1:10809",
		Flags:  flags,
		Before: clix.LoadConfig,
		Action: runNBD,
	}
}

func listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		os.Remove(p) // a stale socket from an earlier run
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

func export(c *cli.Context, cl *initiator.Client) nbd.Export {
	name := c.String("export-name")
	if name == "" {
		name = c.String("volume")
	}
	return nbd.Export{Name: name, Description: "rnic volume " + c.String("volume") + " on " + c.String("target"),
		Backend: cl, ReadOnly: c.Bool("read-only") || cl.ReadOnly(), MultiConn: true}
}

func runNBD(c *cli.Context) error {
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	ln, err := listen(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv := &nbd.Server{Exports: []nbd.Export{export(c, cl)}, Logger: log}
	log.Info("serving NBD", "listen", ln.Addr().String(), "volume", c.String("volume"), "size", cl.Size(), "target", c.String("target"))
	serr := srv.Serve(ctx, ln)
	// Whatever the NBD side did, make acknowledged writes durable.
	fctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
	ferr := cl.Flush(fctx)
	cancel()
	cerr := cl.Close()
	if serr != nil && !errors.Is(serr, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("nbd: %w", serr)
	}
	if ferr != nil {
		return fmt.Errorf("final flush: %w", ferr)
	}
	log.Info("stopped", "flushed", true)
	return cerr
}

func attachCommand() *cli.Command {
	flags := append(sessionFlags(),
		&cli.StringFlag{Name: "device", Value: "/dev/nbd0", Usage: "Linux NBD device to connect", EnvVars: []string{"RINIT_DEVICE"}},
		&cli.BoolFlag{Name: "read-only", Usage: "attach read-only", EnvVars: []string{"RINIT_READ_ONLY"}},
	)
	return &cli.Command{
		Name:  "attach",
		Usage: "connect the volume to a Linux NBD device (/dev/nbdX)",
		Description: "Needs the nbd kernel module (modprobe nbd) and root. The device stays connected until rinit\n" +
			"is stopped (SIGINT/SIGTERM), which flushes and disconnects it.",
		Flags:  flags,
		Before: clix.LoadConfig,
		Action: runAttach,
	}
}

func runAttach(c *cli.Context) error {
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	dev := c.String("device")
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s does not exist: load the nbd kernel module (modprobe nbd) or pick another --device", dev)
		}
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	// Our NBD server on one end of a socket pair; the kernel gets the other.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	srvConn, err := fileConn(fds[0], "rinit-nbd-server")
	if err != nil {
		return err
	}
	kConn, err := fileConn(fds[1], "rinit-nbd-kernel")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	exp := export(c, cl)
	srv := &nbd.Server{Exports: []nbd.Export{exp}, Logger: log}
	go srv.ServeConn(ctx, srvConn)
	done := make(chan error, 1)
	go func() {
		done <- client.Connect(kConn, f, &client.Options{ExportName: exp.Name, BlockSize: 4096,
			OnConnected: func() { log.Info("attached", "device", dev, "volume", c.String("volume"), "size", cl.Size()) }})
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("attach %s: %w", dev, err)
		}
	case <-ctx.Done():
		log.Info("detaching", "device", dev)
		client.Disconnect(f)
		<-done
	}
	fctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("final flush: %w", err)
	}
	return nil
}

func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), filepath.Base(name))
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return conn, nil
}
