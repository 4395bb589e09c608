package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:   "info",
		Usage:  "show the volume's geometry and reservation",
		Flags:  sessionFlags(),
		Before: clix.LoadConfig,
		Action: func(c *cli.Context) error {
			log, err := clix.Logger(c, os.Stderr)
			if err != nil {
				return err
			}
			cl, err := connect(c, log)
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			excl, holders, err := cl.ReservationHolders(ctx)
			if err != nil {
				return fmt.Errorf("reservation: %w", err)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "target:      %s\n", c.String("target"))
			fmt.Fprintf(w, "volume:      %s\n", c.String("volume"))
			fmt.Fprintf(w, "size:        %d bytes (%s)\n", cl.Size(), clix.FormatSize(cl.Size()))
			fmt.Fprintf(w, "block size:  4096 (NBD minimum 512)\n")
			fmt.Fprintf(w, "read-only:   %v\n", cl.ReadOnly())
			fmt.Fprintf(w, "reservation: %s\n", describeReservation(excl, holders))
			return nil
		},
	}
}

func describeReservation(excl bool, holders []string) string {
	switch {
	case len(holders) == 0:
		return "none"
	case excl:
		return "exclusive, held by initiator " + holders[0]
	}
	return "shared, held by initiators " + strings.Join(holders, ", ")
}

func lockCommand() *cli.Command {
	lockFlags := func(extra ...cli.Flag) []cli.Flag {
		fl := append(sessionFlags(),
			&cli.IntFlag{Name: "lock", Usage: "numbered lock `N` (0 .. the volume's lock count - 1)", DefaultText: "none", EnvVars: []string{"RINIT_LOCK"}},
			&cli.BoolFlag{Name: "exclusive", Usage: "the volume reservation, exclusive: only this initiator may write",
				EnvVars: []string{"RINIT_EXCLUSIVE"}},
			&cli.BoolFlag{Name: "shared", Usage: "the volume reservation, shared: nobody may write", EnvVars: []string{"RINIT_SHARED"}},
		)
		return append(fl, extra...)
	}
	return &cli.Command{
		Name:  "lock",
		Usage: "take or inspect numbered locks and the volume reservation",
		Description: "Locks live in the target's lock table and are taken with RDMA atomics (Compare-and-Swap).\n" +
			"A lock belongs to the session that took it: it is released when that session unlocks it or\n" +
			"ends (the target then clears it and advances the fencing generation).",
		Subcommands: []*cli.Command{
			{
				Name:  "acquire",
				Usage: "take a lock (--lock N) or the reservation (--exclusive/--shared) and hold it",
				Description: "Holds until SIGINT/SIGTERM or --hold elapses, then releases. Prints the fencing token.\n" +
					"Fails at once, naming the holder, if someone else holds it (unless --wait).",
				Flags: lockFlags(
					&cli.DurationFlag{Name: "hold", Usage: "release after this long (default: until interrupted)", EnvVars: []string{"RINIT_HOLD"}},
					&cli.BoolFlag{Name: "wait", Usage: "wait for a held lock instead of failing", EnvVars: []string{"RINIT_WAIT"}},
					&cli.StringFlag{Name: "pid-file", Usage: "write this process's pid to `FILE` once the lock is held (for lock release)",
						EnvVars: []string{"RINIT_PID_FILE"}},
				),
				Before: clix.LoadConfig,
				Action: lockAcquire,
			},
			{
				Name:  "release",
				Usage: "release a lock held by `rinit lock acquire --pid-file F` and wait until the target shows it free",
				Description: "Locks belong to sessions, so a lock is released by the session that holds it: this stops the\n" +
					"acquire process named by --pid-file (SIGTERM; it unlocks, then exits) and then checks through the\n" +
					"target that the lock (--lock N) or this initiator's reservation is gone. A lock held by another\n" +
					"initiator is not broken: the command names the holder and fails.",
				Flags: lockFlags(
					&cli.StringFlag{Name: "pid-file", Usage: "pid file written by `rinit lock acquire --pid-file` (required)",
						EnvVars: []string{"RINIT_PID_FILE"}},
				),
				Before: clix.LoadConfig,
				Action: lockRelease,
			},
			{
				Name:   "status",
				Usage:  "show who holds a lock (--lock N) or the reservation",
				Flags:  lockFlags(),
				Before: clix.LoadConfig,
				Action: lockStatus,
			},
		},
	}
}

// lockTarget returns what a lock command names: lock N (-1 for none, the
// reservation) and whether the reservation is meant, exclusive or shared.
func lockTarget(c *cli.Context) (lock int, reserve, exclusive bool, err error) {
	n := 0
	lock = -1
	if c.IsSet("lock") {
		if lock = c.Int("lock"); lock < 0 {
			return 0, false, false, fmt.Errorf("--lock %d: locks are numbered from 0", lock)
		}
		n++
	}
	if c.Bool("exclusive") {
		n++
	}
	if c.Bool("shared") {
		n++
	}
	if n != 1 && (c.Command.Name == "acquire" || c.Command.Name == "release") {
		return 0, false, false, fmt.Errorf("give exactly one of --lock N, --exclusive, --shared")
	}
	return lock, c.Bool("exclusive") || c.Bool("shared"), c.Bool("exclusive"), nil
}

func lockAcquire(c *cli.Context) error {
	n, reserve, excl, err := lockTarget(c)
	if err != nil {
		return err
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	// The pid file is written to a temporary file in its directory,
	// made now, and renamed into place once the lock is held: a bad path
	// fails before anything is acquired, and whoever waits for the file
	// to appear finds it whole.
	var pidTmp *os.File
	if pf := c.String("pid-file"); pf != "" {
		f, err := os.CreateTemp(filepath.Dir(pf), "."+filepath.Base(pf)+".*")
		if err != nil {
			return fmt.Errorf("--pid-file: %w", err)
		}
		pidTmp = f
		defer func() {
			if pidTmp != nil {
				pidTmp.Close()
				os.Remove(pidTmp.Name())
			}
		}()
	}
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if d := c.Duration("hold"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	w := c.App.Writer
	var release func(context.Context) error
	if reserve {
		r, err := cl.Reserve(ctx, excl)
		if err != nil {
			return err
		}
		mode := "shared"
		if excl {
			mode = "exclusive"
		}
		tok, err := cl.Token(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "reservation %s acquired, fencing token %d\n", mode, tok)
		release = r.Release
	} else {
		var l *initiator.Lock
		if c.Bool("wait") {
			l, err = cl.Lock(ctx, uint32(n))
		} else {
			l, err = cl.TryLock(ctx, uint32(n))
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "lock %d acquired, fencing token %d\n", n, l.Token())
		release = l.Unlock
	}
	if pidTmp != nil {
		pf := c.String("pid-file")
		_, err := pidTmp.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		if err == nil {
			err = pidTmp.Chmod(0o644)
		}
		if cerr := pidTmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(pidTmp.Name(), pf)
		}
		if err != nil {
			release(context.Background())
			return fmt.Errorf("--pid-file: %w", err)
		}
		pidTmp = nil
		defer os.Remove(pf)
	}
	<-ctx.Done()
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := release(rctx); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	fmt.Fprintln(w, "released")
	return nil
}

func lockStatus(c *cli.Context) error {
	n, _, _, err := lockTarget(c)
	if err != nil {
		return err
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	w := c.App.Writer
	if n >= 0 {
		name, held, err := cl.LockHolder(ctx, uint32(n))
		if err != nil {
			return err
		}
		if held {
			fmt.Fprintf(w, "lock %d: held by initiator %s\n", n, name)
		} else {
			fmt.Fprintf(w, "lock %d: free\n", n)
		}
		return nil
	}
	excl, holders, err := cl.ReservationHolders(ctx)
	if err != nil {
		return err
	}
	if len(holders) > 0 && excl {
		fmt.Fprintf(w, "volume reserved by initiator %s (exclusive)\n", holders[0])
		return nil
	}
	fmt.Fprintf(w, "reservation: %s\n", describeReservation(excl, holders))
	return nil
}

func lockRelease(c *cli.Context) error {
	n, _, _, err := lockTarget(c)
	if err != nil {
		return err
	}
	pf := c.String("pid-file")
	if pf == "" {
		return fmt.Errorf("--pid-file is required: locks belong to the session of the `rinit lock acquire` holding them")
	}
	b, err := os.ReadFile(pf)
	if err != nil {
		return fmt.Errorf("--pid-file: %w (is the lock still held?)", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("--pid-file %s: no pid in it", pf)
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal the holder (pid %d): %w", pid, err)
	}
	cl, err := connect(c, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	for {
		var held bool
		var who string
		if n >= 0 {
			who, held, err = cl.LockHolder(ctx, uint32(n))
		} else {
			var holders []string
			_, holders, err = cl.ReservationHolders(ctx)
			for _, h := range holders {
				if h == c.String("name") {
					held, who = true, h
				}
			}
		}
		if err != nil {
			return err
		}
		if !held {
			fmt.Fprintln(c.App.Writer, "released")
			return nil
		}
		if syscall.Kill(pid, 0) != nil && n >= 0 && who != c.String("name") {
			return fmt.Errorf("lock %d is held by initiator %s, not by the process in %s", n, who, pf)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still held by %s after %s", who, c.Duration("timeout"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
