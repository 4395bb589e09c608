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
			"an existing volume is opened as it is (repeatable)", EnvVars: []string{"RTARGET_VOLUME"}},
		&cli.StringFlag{Name: "secret-file", Usage: "file holding the pre-shared secret initiators authenticate with",
			EnvVars: []string{"RTARGET_SECRET_FILE"}},
		&cli.BoolFlag{Name: "insecure", Usage: "allow a non-loopback listener without a secret", EnvVars: []string{"RTARGET_INSECURE"}},
		&cli.StringFlag{Name: "metrics-listen", Usage: "serve Prometheus /metrics and /healthz on this HTTP address",
			EnvVars: []string{"RTARGET_METRICS_LISTEN"}},
		&cli.DurationFlag{Name: "drain-timeout", Value: 30 * time.Second, Usage: "on SIGTERM, how long to wait for requests in flight",
			EnvVars: []string{"RTARGET_DRAIN_TIMEOUT"}},
		&cli.StringFlag{Name: "mapped-budget", Value: "128M", Usage: "badger: file-backed memory kept mapped before pages are " +
			"given back to the kernel (bounds RSS; 'off' disables)", EnvVars: []string{"RTARGET_MAPPED_BUDGET"}},
	}
	flags = append(flags, dataFlags()...)
	flags = append(flags, clix.LogFlags("RTARGET_")...)
	flags = append(flags, clix.ProfileFlag("RTARGET_"), clix.CPUsFlag("RTARGET_"))
	return &cli.Command{
		Name:  "serve",
		Usage: "serve volumes to initiators",
		Description: "Opens the store, creates the --volume volumes that do not exist yet, and serves them.\n" +
			"SIGTERM or SIGINT drain requests in flight and sync the store; SIGHUP re-reads --config and\n" +
			"creates newly listed volumes (it never deletes one).",
		Flags:  flags,
		Before: clix.LoadConfig,
		Action: runServe,
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

func openStore(c *cli.Context, log *slog.Logger) (store.Store, error) {
	switch c.String("store") {
	case "memory":
		return store.NewMemory(), nil
	case "badger":
		opts := store.BadgerOptions{Logger: log}
		if mb := c.String("mapped-budget"); c.Command.Names()[0] == "serve" && mb != "" {
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
	}
	return nil, fmt.Errorf("--store %q: want badger or memory", c.String("store"))
}

// ensureVolumes creates the volumes that do not exist. An existing volume is
// never recreated: a different size is reported and the volume kept.
func ensureVolumes(ctx context.Context, st store.Store, specs []volumeSpec, log *slog.Logger) error {
	have, err := st.ListVolumes(ctx)
	if err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	sizes := map[string]int64{}
	for _, v := range have {
		sizes[v.Name] = v.Size
	}
	for _, s := range specs {
		if cur, ok := sizes[s.name]; ok {
			if cur != s.size {
				log.Warn("volume exists with another size: keeping it as it is (volumes are never resized or recreated)",
					"volume", s.name, "size", clix.FormatSize(cur), "asked", clix.FormatSize(s.size))
			}
			continue
		}
		if _, err := st.CreateVolume(ctx, s.name, s.size, map[string]string{"created-by": "rtarget serve"}); err != nil {
			return fmt.Errorf("create volume %s: %w", s.name, err)
		}
		sizes[s.name] = s.size
		log.Info("volume created", "volume", s.name, "size", clix.FormatSize(s.size))
	}
	return nil
}

// configVolumes reads the volume lines of the config file (for SIGHUP).
func configVolumes(c *cli.Context) ([]string, error) {
	vols := append([]string(nil), c.StringSlice("volume")...)
	path := c.String("config")
	if path == "" {
		return vols, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	kv, err := clix.ParseConfig(f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	for _, e := range kv {
		if e.Key == "volume" {
			vols = append(vols, e.Value)
		}
	}
	return vols, nil
}

func runServe(c *cli.Context) error {
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
	specs, err := parseVolumeSpecs(c.StringSlice("volume"))
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(c.Context)
	defer stop()
	st, err := openStore(c, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
	}()
	if err := ensureVolumes(ctx, st, specs, log); err != nil {
		return err
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
	if ma := c.String("metrics-listen"); ma != "" {
		ln, err := net.Listen("tcp", ma)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		srv := &http.Server{Handler: metricsHandler(t, st, log), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("metrics", "addr", ln.Addr().String())
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	served := make(chan error, 1)
	go func() { served <- t.Serve(ctx, l) }()
	vols, _ := st.ListVolumes(ctx)
	names := make([]string, 0, len(vols))
	for _, v := range vols {
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
				vs, err := configVolumes(c)
				if err == nil {
					var specs []volumeSpec
					if specs, err = parseVolumeSpecs(vs); err == nil {
						err = ensureVolumes(ctx, st, specs, log)
					}
				}
				if err != nil {
					log.Error("reload", "err", err)
				} else {
					log.Info("reloaded volumes")
				}
				continue
			}
			log.Info("draining", "signal", sig.String(), "timeout", c.Duration("drain-timeout"))
			dctx, cancel := context.WithTimeout(context.Background(), c.Duration("drain-timeout"))
			err := t.Shutdown(dctx)
			cancel()
			l.Close()
			if err != nil {
				log.Error("drain incomplete", "err", err)
			}
			if err := st.Sync(context.Background()); err != nil {
				return fmt.Errorf("sync: %w", err)
			}
			log.Info("stopped: store synced")
			return nil
		}
	}
}
