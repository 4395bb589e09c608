package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

func serveCommand() *cli.Command {
	flags := []cli.Flag{
		clix.ConfigFlag("RTARGET_"),
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:4420", Usage: "RNIC (TCP) listen address", EnvVars: []string{"RTARGET_LISTEN"}},
		&cli.StringSliceFlag{Name: "volume", Usage: "serve volume `NAME:SIZE` (SIZE like 512M, 10G); created on first start, " +
			"an existing volume is opened as it is (repeatable; adds to the config file's volume lines)", EnvVars: []string{"RTARGET_VOLUME"}},
		&cli.StringFlag{Name: "secret-file", Usage: "file holding the pre-shared secret initiators authenticate with",
			EnvVars: []string{"RTARGET_SECRET_FILE"}},
		&cli.BoolFlag{Name: "insecure", Usage: "allow a non-loopback listener without a secret", EnvVars: []string{"RTARGET_INSECURE"}},
		&cli.StringFlag{Name: "metrics-listen", Usage: "serve Prometheus /metrics, /healthz and Go's /debug/pprof/ on this HTTP address",
			EnvVars: []string{"RTARGET_METRICS_LISTEN"}},
		&cli.DurationFlag{Name: "drain-timeout", Value: 30 * time.Second, Usage: "on SIGTERM, how long to wait for requests in " +
			"flight; those still running then are cut off, and serve exits with status 1 once the store is synced",
			EnvVars: []string{"RTARGET_DRAIN_TIMEOUT"}},
	}
	flags = append(flags, nvmfFlags()...)
	flags = append(flags, storeFlags()...)
	flags = append(flags, clix.LogFlags("RTARGET_")...)
	flags = append(flags, clix.ProfileFlag("RTARGET_"), clix.CPUsFlag("RTARGET_"), memoryLimitFlag())
	// The --volume values of the command line and RTARGET_VOLUME, before
	// --config adds its lines: SIGHUP needs them apart from the file's.
	var given []string
	return &cli.Command{
		Name:  "serve",
		Usage: "serve volumes to initiators",
		Description: "Opens the store, creates the listed volumes that do not exist yet, and serves every volume of the\n" +
			"store. The list is the --volume flags (or RTARGET_VOLUME) plus the volume lines of --config, a name\n" +
			"listed twice counting once (the first: the command line's, then the file's in order).\n" +
			"SIGTERM or SIGINT drain requests in flight and sync the store; requests still in flight after\n" +
			"--drain-timeout are cut off, and the exit status is then 1. A further signal while it stops is\n" +
			"logged and ignored (SIGKILL stops at once). SIGHUP re-reads the volume lines of\n" +
			"--config and creates the volumes newly listed. serve never resizes, recreates or deletes a volume.\n" +
			"With --nvmf-listen, every volume is also served over NVMe/RDMA as namespace 1 of subsystem\n" +
			"nqn.2026-11.dev.rnic:NAME, for the Linux kernel's nvme-rdma host (nvme discover / nvme connect -t rdma);\n" +
			"NVMe in-band authentication (DH-HMAC-CHAP) is not implemented: access is by host NQN (--nvmf-host).",
		Flags: flags,
		Before: func(c *cli.Context) error {
			if c.IsSet("volume") {
				given = append([]string(nil), c.StringSlice("volume")...)
			}
			return clix.LoadSharedConfig(c)
		},
		Action: func(c *cli.Context) error { return runServe(c, given) },
	}
}

// volumeSpec is one --volume NAME:SIZE.
type volumeSpec struct {
	name string
	size int64
}

func parseVolumeSpecs(specs []string) ([]volumeSpec, error) {
	var out []volumeSpec
	for _, s := range specs {
		name, size, ok := strings.Cut(s, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("--volume %q: want NAME:SIZE, e.g. disk0:10G", s)
		}
		n, err := clix.ParseSize(size)
		if err != nil {
			return nil, fmt.Errorf("--volume %q: %w", s, err)
		}
		if n%store.BlockSize != 0 {
			return nil, fmt.Errorf("--volume %q: size must be a multiple of %d bytes", s, store.BlockSize)
		}
		out = append(out, volumeSpec{name, n})
	}
	return out, nil
}

// ensureVolumes creates the volumes that do not exist and returns their
// names. An existing volume is never recreated: a different size is
// reported and the volume kept.
func ensureVolumes(ctx context.Context, st store.Store, specs []volumeSpec, log *slog.Logger) (created []string, err error) {
	have, err := st.ListVolumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	sizes := map[string]int64{}
	unavailable := map[string]bool{}
	for _, v := range have {
		sizes[v.Name] = v.Size
		unavailable[v.Name] = v.Unavailable != ""
	}
	for _, s := range specs {
		if cur, ok := sizes[s.name]; ok {
			// An unavailable volume's size is unknown (serve logs it as
			// unavailable).
			if cur != s.size && !unavailable[s.name] {
				log.Warn("volume exists with another size: keeping it as it is (volumes are never resized or recreated)",
					"volume", s.name, "size", clix.FormatSize(cur), "asked", clix.FormatSize(s.size))
			}
			continue
		}
		if _, err := st.CreateVolume(ctx, s.name, s.size, store.CreateOptions{Meta: map[string]string{"created-by": "rtarget serve"}}); err != nil {
			return created, fmt.Errorf("create volume %s: %w", s.name, err)
		}
		sizes[s.name] = s.size
		created = append(created, s.name)
		log.Info("volume created", "volume", s.name, "size", clix.FormatSize(s.size))
	}
	return created, nil
}

// listedVolumes is the list of volumes serve creates: the --volume values
// given on the command line or in RTARGET_VOLUME, then the volume lines the
// config file has now (read again on every call, so that SIGHUP sees the
// current file). A name listed twice counts once: the first, so the command
// line's size is the one checked against an existing volume.
func listedVolumes(c *cli.Context, given []string, log *slog.Logger) ([]volumeSpec, error) {
	vals := append([]string(nil), given...)
	if path := c.String("config"); path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		kv, err := clix.ParseConfig(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
		for _, e := range kv {
			if e.Key == "volume" {
				vals = append(vals, e.Value)
			}
		}
	}
	specs, err := parseVolumeSpecs(vals)
	if err != nil {
		return nil, err
	}
	out := specs[:0]
	first := map[string]int64{}
	for _, s := range specs {
		if size, dup := first[s.name]; dup {
			if size != s.size {
				log.Warn("volume listed twice with different sizes: the first counts", "volume", s.name,
					"size", clix.FormatSize(size), "ignored", clix.FormatSize(s.size))
			}
			continue
		}
		first[s.name] = s.size
		out = append(out, s)
	}
	return out, nil
}

// reloadVolumes is SIGHUP: it creates the volumes listed now that do not
// exist yet.
func reloadVolumes(ctx context.Context, c *cli.Context, st store.Store, given []string, log *slog.Logger) {
	specs, err := listedVolumes(c, given, log)
	if err != nil {
		log.Error("reload: volumes unchanged", "err", err)
		return
	}
	created, err := ensureVolumes(ctx, st, specs, log)
	if err != nil {
		log.Error("reload", "err", err, "created", strings.Join(created, ","))
		return
	}
	log.Info("reloaded volumes", "listed", len(specs), "created", strings.Join(created, ","))
}

// runServe is rtarget serve; given are the --volume values of the command
// line and RTARGET_VOLUME (without the config file's).
func runServe(c *cli.Context, given []string) (err error) {
	log, err := clix.Logger(c, os.Stderr)
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
	addr := c.String("listen")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		// Said first: the secret check below would otherwise take a
		// mistyped address for a non-loopback one.
		return &clix.UsageError{Command: "rtarget serve", Err: fmt.Errorf("--listen %q: %w", addr, err)}
	}
	secret, haveSecret, err := clix.ReadSecret(c.String("secret-file"))
	if err != nil {
		return err
	}
	if !haveSecret {
		if !clix.IsLoopback(addr) && !c.Bool("insecure") {
			return fmt.Errorf("refusing to listen on %s without --secret-file (use --insecure to allow it)", addr)
		}
		log.Warn("no --secret-file: initiators authenticate with the public default secret")
	}
	specs, err := listedVolumes(c, given, log)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(c.Context)
	defer stop()
	if _, err := startMemoryGovernor(ctx, c.String("memory-limit"), log); err != nil {
		return err
	}
	st, err := openStore(c, log, true)
	if err != nil {
		return err
	}
	// Signals are caught from here on, before the control socket and the
	// listener appear: a SIGTERM sent as soon as either is seen is then
	// served by the loop below (a drain, status 0), never the default
	// action. One that comes while the store opens still kills the
	// process, which the store survives as it would a crash.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer func() {
		// A store that does not close cleanly (its file system died) makes
		// the exit status an error, as a failed sync does.
		if cerr := st.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close the store: %w", cerr))
		}
		// Signals are let go only now: one that came while rtarget
		// stopped was logged and ignored (ignoreSignals), where its
		// default action would have killed the process halfway through
		// the store's close, with a signal's exit status.
		signal.Stop(sigs)
	}()
	if _, err := ensureVolumes(ctx, st, specs, log); err != nil {
		return err
	}
	if k, err := findStore(c.String("store")); err == nil {
		if path := k.control(c); path != "" {
			ctl, err := listenControl(path, st, log)
			if err != nil {
				return err
			}
			defer ctl.close()
			log.Info("control socket", "path", path)
		}
	}
	dev, err := rnic.Open(rnic.Config{Name: "rtarget", Logger: log})
	if err != nil {
		return err
	}
	defer dev.Close()
	l, err := dev.Listen(addr)
	if err != nil {
		return err
	}
	t, err := target.New(target.Config{Store: st, Device: dev, Secret: target.StaticSecret(secret), Logger: log})
	if err != nil {
		return err
	}
	nsrv, native, err := startNVMF(ctx, c, dev, t, st, l, log)
	if err != nil {
		return err
	}
	if ma := c.String("metrics-listen"); ma != "" {
		ln, err := net.Listen("tcp", ma)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		stop, _ := serveMetrics(ln, metricsHandler(t, nsrv, st, log), log)
		defer stop()
		log.Info("metrics", "addr", ln.Addr().String())
	}
	served := make(chan error, 1)
	go func() { served <- t.Serve(ctx, native) }()
	vols, err := st.ListVolumes(ctx)
	if err != nil {
		// Only this log line needs the list: logins find their volumes
		// themselves, and report what fails then.
		log.Warn("cannot list the volumes", "err", err)
	}
	names := make([]string, 0, len(vols))
	for _, v := range vols {
		if v.Unavailable != "" {
			log.Warn("volume unavailable: logins to it fail until its file or device is back",
				"volume", v.Name, "path", v.RawPath, "err", v.Unavailable)
			names = append(names, v.Name+"(unavailable)")
			continue
		}
		names = append(names, fmt.Sprintf("%s(%s)", v.Name, clix.FormatSize(v.Size)))
	}
	log.Info("serving", "listen", l.Addr().String(), "store", c.String("store"), "volumes", strings.Join(names, ","))
	for {
		select {
		case err := <-served:
			if errors.Is(err, target.ErrClosed) {
				return nil
			}
			return fmt.Errorf("serve: %w", err)
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				reloadVolumes(ctx, c, st, given, log)
				continue
			}
			log.Info("draining", "signal", sig.String(), "timeout", c.Duration("drain-timeout"))
			go ignoreSignals(ctx, sigs, log)
			dctx, cancel := context.WithTimeout(context.Background(), c.Duration("drain-timeout"))
			var drainErr error
			if nsrv != nil {
				drainErr = nsrv.Shutdown(dctx)
			}
			drainErr = errors.Join(drainErr, t.Shutdown(dctx))
			cancel()
			l.Close()
			if drainErr != nil {
				log.Error("drain incomplete", "err", drainErr)
			}
			if err := st.Sync(context.Background()); err != nil {
				if drainErr != nil {
					return fmt.Errorf("sync: %w (after the drain incomplete: %w)", err, drainErr)
				}
				return fmt.Errorf("sync: %w", err)
			}
			if drainErr != nil {
				// Requests were cut off unanswered: not a clean stop, which
				// the exit status says (systemd marks the unit failed).
				log.Info("stopped: store synced, drain incomplete")
				return fmt.Errorf("drain incomplete (the store is synced): %w", drainErr)
			}
			log.Info("stopped: store synced")
			return nil
		}
	}
}

// ignoreSignals logs and drops the signals that come while rtarget stops,
// until ctx ends (after the store closed). A stop cannot be hurried: the
// drain has its timeout, and the store's sync and close must finish for
// the exit to be clean; SIGKILL stops at once, losing no write that a
// flush acknowledged.
func ignoreSignals(ctx context.Context, sigs <-chan os.Signal, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			log.Warn("already stopping: signal ignored (SIGKILL stops at once, losing no flushed write)",
				"signal", sig.String())
		}
	}
}
