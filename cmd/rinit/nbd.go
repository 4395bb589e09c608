package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/initiator/nbd"
)

func nbdCommand() *cli.Command {
	flags := append(sessionFlags(), clix.ProfileFlag("RINIT_"), clix.CPUsFlag("RINIT_"),
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:10809", Usage: "NBD listen address HOST:PORT or unix:PATH (a stale socket at PATH is replaced; " +
			"a socket in use or anything else there is refused)",
			EnvVars: []string{"RINIT_LISTEN"}},
		&cli.StringFlag{Name: "export-name", Usage: "NBD export name (default: the volume name; clients asking for \"\" get it too)",
			EnvVars: []string{"RINIT_EXPORT_NAME"}},
		&cli.BoolFlag{Name: "read-only", Usage: "export read-only", EnvVars: []string{"RINIT_READ_ONLY"}},
		&cli.StringFlag{Name: "debug-listen", Usage: "serve Go's runtime profiles (/debug/pprof/) on this HTTP address, e.g. 127.0.0.1:6060",
			EnvVars: []string{"RINIT_DEBUG_LISTEN"}},
	)
	return &cli.Command{
		Name:  "nbd",
		Usage: "serve the volume to NBD clients",
		Description: "Logs in to the volume and serves it over the NBD protocol (fixed newstyle) with FLUSH, FUA,\n" +
			"TRIM, WRITE_ZEROES and multi-conn: every NBD connection shares the one session, and a flush\n" +
			"on any of them reaches the target's store sync. A lost session is re-established (at the next\n" +
			"--target) and its requests replayed (but not those of an NBD client that left meanwhile without\n" +
			"NBD_CMD_DISC: they are dropped); when every target refuses the login for good (the volume\n" +
			"is gone, the secret changed), rinit ends the NBD connections and exits with an error.\n" +
			"Try: nbdinfo nbd://127.0.0.1:10809",
		Flags:  flags,
		Before: clix.LoadConfig,
		Action: runNBD,
	}
}

// listen listens on HOST:PORT or unix:PATH.
func listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if p == "" {
			return nil, fmt.Errorf("%q: empty socket path (want unix:PATH)", addr)
		}
		if err := removeStaleSocket(p); err != nil {
			return nil, err
		}
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

// removeStaleSocket removes the socket an earlier run left at path, so that
// listening there works again. Anything else at path is kept and refused:
// a file that is not a socket, and a socket some process still accepts
// connections on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unix socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("unix socket %s: a %s is there, not a socket: refusing to replace it", path, fileKind(fi.Mode()))
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("unix socket %s: in use (another process accepts connections on it)", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("unix socket %s: cannot tell whether it is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("unix socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	case m.IsRegular():
		return "regular file"
	}
	return "file of type " + m.Type().String()
}

// The Client is the export's backend with its fast paths (requests
// started from the NBD reader, replies flushed per burst of completions,
// commands of a burst sent together): a change of signature on either
// side fails the build here instead of silently losing them.
var (
	_ nbd.AsyncBackend    = (*initiator.Client)(nil)
	_ nbd.Plugger         = (*initiator.Client)(nil)
	_ nbd.BlockStatuser   = (*initiator.Client)(nil)
	_ nbd.AllocatedZeroer = (*initiator.Client)(nil)
	_ nbd.LossCounter     = (*initiator.Client)(nil)
)

func export(c *cli.Context, cl *initiator.Client) nbd.Export {
	name := c.String("export-name")
	if name == "" {
		name = c.String("volume")
	}
	return nbd.Export{Name: name, Description: "rnic volume " + c.String("volume") + " on " + c.String("target"),
		Backend: cl, ReadOnly: c.Bool("read-only") || cl.ReadOnly(), MultiConn: true}
}

func runNBD(c *cli.Context) error {
	log, err := clix.Logger(c, c.App.ErrWriter)
	if err != nil {
		return err
	}
	if err := clix.ApplyCPUs(c); err != nil {
		return err
	}
	stopProfile, err := clix.StartProfile(c)
	if err != nil {
		return err
	}
	defer stopProfile()
	ln, err := listen(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()
	if da := c.String("debug-listen"); da != "" {
		dl, err := net.Listen("tcp", da)
		if err != nil {
			return fmt.Errorf("--debug-listen: %w", err)
		}
		mux := http.NewServeMux()
		clix.AddPprof(mux)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(dl)
		defer srv.Close()
		log.Info("debug", "addr", dl.Addr().String())
	}
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	sigCtx, sigs, stop := stopOnSignal(c.Context)
	defer stop()
	ctx, lost, stopWatch := untilGivenUp(sigCtx, c, log, cl)
	defer stopWatch()
	srv := &nbd.Server{Exports: []nbd.Export{export(c, cl)}, Logger: log}
	log.Info("serving NBD", "listen", ln.Addr().String(), "volume", c.String("volume"), "size", cl.Size(), "target", c.String("target"))
	serr := srv.Serve(ctx, ln)
	// Whatever the NBD side did, make acknowledged writes durable.
	ferr := finalFlush(c, log, cl, sigs)
	cerr := cl.Close()
	if err := lost(); err != nil {
		return errors.Join(err, ferr)
	}
	if serr != nil && !errors.Is(serr, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("nbd: %w", serr)
	}
	if ferr != nil {
		return ferr
	}
	return cerr
}

// untilGivenUp returns a context that ends with parent, or as soon as the
// initiator gives up on the volume for good (initiator.Client.GaveUp:
// every --target refused to log it in again for good, e.g. the volume is
// gone there). Until then a lost session is only waited for: the
// initiator reconnects and replays, and the NBD clients see nothing but a
// delay. Once it gave up, every request would fail with EIO for as long
// as rinit ran, so it logs the cause as an error and the context ends:
// the NBD server stops taking requests, answers those in flight (they
// fail: nothing is acknowledged that the target did not do) and closes
// its connections, so the clients see the export gone. lost then returns
// the error rinit exits with (nil while the initiator has not given up);
// stop ends the watch.
func untilGivenUp(parent context.Context, c *cli.Context, log *slog.Logger, cl *initiator.Client) (ctx context.Context,
	lost func() error, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-cl.GaveUp():
			log.Error("the initiator gave up on the target: ending the NBD connections", "target", c.String("target"),
				"volume", c.String("volume"), "err", cl.Err())
			cancel()
		case <-ctx.Done():
		}
	}()
	lost = func() error {
		select {
		case <-cl.GaveUp():
			return fmt.Errorf("the session with target %s for volume %s is lost for good (the initiator gave up reconnecting): %w",
				c.String("target"), c.String("volume"), cl.Err())
		default:
			return nil
		}
	}
	return ctx, lost, cancel
}

// stopOnSignal returns a context that the first SIGINT or SIGTERM ends;
// later ones arrive on sigs.
func stopOnSignal(parent context.Context) (context.Context, <-chan os.Signal, func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, sigs, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// finalFlush makes the writes the target acknowledged durable before rinit
// exits. With none unflushed it returns at once, whether or not the target
// is reachable. Otherwise it waits for the target (the session reconnects
// if it was lost) up to --timeout, and another SIGINT or SIGTERM on sigs
// gives up at once; the error then says which writes may not be durable.
func finalFlush(c *cli.Context, log *slog.Logger, cl *initiator.Client, sigs <-chan os.Signal) error {
	if !cl.Unflushed() {
		log.Info("stopped: every acknowledged write was already flushed")
		return nil
	}
	timeout := c.Duration("timeout")
	log.Info("flushing the writes the target acknowledged since the last flush (SIGINT or SIGTERM again to exit without)",
		"target", c.String("target"), "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			log.Warn("signal during the final flush: giving it up")
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("final flush failed: writes the target %s acknowledged on volume %s since the last flush "+
			"may not be durable (the target keeps them only if it flushes or shuts down cleanly): %w",
			c.String("target"), c.String("volume"), err)
	}
	log.Info("stopped: acknowledged writes flushed")
	return nil
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
			"is stopped (SIGINT/SIGTERM), which flushes and disconnects it, or until every target refuses\n" +
			"the login for good: then rinit disconnects it and exits with an error.",
		Flags:  flags,
		Before: clix.LoadConfig,
		Action: runAttach,
	}
}

// The Linux NBD driver's ioctls: linux/nbd.h defines NBD_X as _IO(0xab, n),
// whose encoding (ioIONone) depends on the architecture. They are spelled
// out here rather than taken from go-nbd's pkg/ioctl, which has them for
// amd64 or through cgo only, so that rinit cross-compiles (arm64 servers)
// and builds with CGO_ENABLED=0 everywhere.
const (
	nbdSetSock       = ioIONone | 0xab<<8 | 0
	nbdSetBlockSize  = ioIONone | 0xab<<8 | 1
	nbdDoIt          = ioIONone | 0xab<<8 | 3
	nbdClearSock     = ioIONone | 0xab<<8 | 4
	nbdClearQueue    = ioIONone | 0xab<<8 | 5
	nbdSetSizeBlocks = ioIONone | 0xab<<8 | 7
	nbdDisconnect    = ioIONone | 0xab<<8 | 8
	nbdSetFlags      = ioIONone | 0xab<<8 | 10
	attachBlockSize  = 4096
)

func nbdIoctl(f *os.File, req, arg uintptr) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, arg); e != 0 {
		return e
	}
	return nil
}

// runAttach does what nbd-client does, with our NBD server on the other end
// of a socket pair: it tells the kernel the size, block size and flags by
// ioctl (the handshake happens here, not on the socket), hands it one end
// with NBD_SET_SOCK, serves the transmission phase on the other, and blocks
// in NBD_DO_IT until disconnected. (go-nbd's client negotiates over the
// socket first, and its NBD_OPT_GO carries a zero option length, which a
// conforming server rejects.)
func runAttach(c *cli.Context) error {
	log, err := clix.Logger(c, c.App.ErrWriter)
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
	exp := export(c, cl)
	size := cl.Size()
	if size%attachBlockSize != 0 {
		return fmt.Errorf("volume size %d is not a multiple of %d", size, attachBlockSize)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	srvConn, err := fileConn(fds[0], "rinit-nbd-server")
	if err != nil {
		return err
	}
	kernelSock := os.NewFile(uintptr(fds[1]), "rinit-nbd-kernel")
	defer kernelSock.Close()
	for _, s := range []struct {
		name     string
		req, arg uintptr
	}{
		{"NBD_CLEAR_SOCK", nbdClearSock, 0},
		{"NBD_SET_BLKSIZE", nbdSetBlockSize, attachBlockSize},
		{"NBD_SET_SIZE_BLOCKS", nbdSetSizeBlocks, uintptr(size / attachBlockSize)},
		{"NBD_SET_FLAGS", nbdSetFlags, uintptr(exp.TransmissionFlags())},
		{"NBD_SET_SOCK", nbdSetSock, kernelSock.Fd()},
	} {
		if err := nbdIoctl(f, s.req, s.arg); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("%s: %s: device busy (already attached? nbd-client -d %s)", dev, s.name, dev)
			}
			return fmt.Errorf("%s: %s: %w", dev, s.name, err)
		}
	}
	sigCtx, sigs, stop := stopOnSignal(c.Context)
	defer stop()
	// ctx also ends when the initiator gives up on the target: the device
	// is then disconnected as on SIGTERM, and rinit exits with the cause.
	ctx, lost, stopWatch := untilGivenUp(sigCtx, c, log, cl)
	defer stopWatch()
	srv := &nbd.Server{Exports: []nbd.Export{exp}, Logger: log}
	srvCtx, cancelSrv := context.WithCancel(context.Background())
	defer cancelSrv()
	served := make(chan error, 1)
	go func() { served <- srv.ServeTransmission(srvCtx, srvConn, exp.Name) }()
	doIt := make(chan error, 1)
	go func() { doIt <- nbdDoItIoctl(f) }()
	go func() { // the device is usable once the kernel reports its size
		sizeFile := filepath.Join("/sys/block", filepath.Base(dev), "size")
		for i := 0; i < 100; i++ {
			if b, err := os.ReadFile(sizeFile); err == nil && strings.TrimSpace(string(b)) != "0" {
				log.Info("attached", "device", dev, "volume", c.String("volume"), "size", size)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var doErr error
	select {
	case doErr = <-doIt:
	case <-ctx.Done():
		log.Info("detaching", "device", dev)
		// What nbd-client -d does: the kernel flushes, sends NBD_CMD_DISC
		// and NBD_DO_IT returns. After the initiator gave up, the flush
		// and the requests queued fail (EIO) and the device goes away.
		if err := nbdIoctl(f, nbdDisconnect, 0); err != nil {
			log.Warn("NBD_DISCONNECT", "err", err)
		}
		doErr = <-doIt
	}
	nbdIoctl(f, nbdClearQueue, 0)
	nbdIoctl(f, nbdClearSock, 0)
	cancelSrv()
	if err := <-served; err != nil {
		log.Warn("nbd transmission ended", "err", err)
	}
	ferr := finalFlush(c, log, cl, sigs)
	if err := lost(); err != nil {
		return errors.Join(err, ferr)
	}
	if ferr != nil {
		return ferr
	}
	if doErr != nil && ctx.Err() == nil {
		return fmt.Errorf("%s: NBD_DO_IT: %w", dev, doErr)
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
