package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
)

func volumeCommand() *cli.Command {
	flags := append([]cli.Flag{clix.ConfigFlag("RTARGET_")}, dataFlags()[0])
	flags = append(flags, clix.LogFlags("RTARGET_")...)
	sub := func(name, usage, args string, action cli.ActionFunc, extra ...cli.Flag) *cli.Command {
		return &cli.Command{Name: name, Usage: usage, ArgsUsage: args, Flags: append(append([]cli.Flag{}, flags...), extra...),
			Before: clix.LoadConfig, Action: action}
	}
	return &cli.Command{
		Name:  "volume",
		Usage: "manage the volumes of a store (offline: stop rtarget serve first)",
		Description: "These commands open the badger store in --data directly; the store can be open in only one\n" +
			"process at a time, so run them while rtarget serve is stopped.",
		Subcommands: []*cli.Command{
			sub("create", "create an empty (all-zero) volume", "NAME SIZE", volumeCreate),
			sub("list", "list volumes", "", volumeList),
			sub("delete", "delete a volume and all its data", "NAME", volumeDelete),
			sub("import", "copy a raw image into a volume (creates it with the image's size if missing)", "NAME FILE", volumeImport,
				progressFlag()),
			sub("export", "copy a volume out to a raw image file", "NAME FILE", volumeExport, progressFlag()),
		},
	}
}

func withStore(c *cli.Context, nargs int, f func(ctx context.Context, st store.Store, args []string) error) error {
	if c.NArg() != nargs {
		return fmt.Errorf("%s: want %d argument(s): %s", c.Command.FullName(), nargs, c.Command.ArgsUsage)
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	st, err := store.OpenBadger(c.String("data"), store.BadgerOptions{Logger: log})
	if err != nil {
		return fmt.Errorf("open store %s: %w", c.String("data"), err)
	}
	err = f(c.Context, st, c.Args().Slice())
	if cerr := st.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close store: %w", cerr)
	}
	return err
}

func volumeCreate(c *cli.Context) error {
	return withStore(c, 2, func(ctx context.Context, st store.Store, a []string) error {
		n, err := clix.ParseSize(a[1])
		if err != nil {
			return err
		}
		if n%store.BlockSize != 0 {
			return fmt.Errorf("size must be a multiple of %d bytes", store.BlockSize)
		}
		if _, err := st.CreateVolume(ctx, a[0], n, map[string]string{"created-by": "rtarget volume create"}); err != nil {
			return fmt.Errorf("create %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "created %s (%s)\n", a[0], clix.FormatSize(n))
		return nil
	})
}

func volumeList(c *cli.Context) error {
	return withStore(c, 0, func(ctx context.Context, st store.Store, _ []string) error {
		vs, err := st.ListVolumes(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSIZE\tBYTES\tCREATED")
		for _, v := range vs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", v.Name, clix.FormatSize(v.Size), v.Size, v.Created.Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

func volumeDelete(c *cli.Context) error {
	return withStore(c, 1, func(ctx context.Context, st store.Store, a []string) error {
		if err := st.DeleteVolume(ctx, a[0]); err != nil {
			return fmt.Errorf("delete %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "deleted %s\n", a[0])
		return nil
	})
}

// progressFlag is --progress of import and export.
func progressFlag() cli.Flag {
	return &cli.BoolFlag{Name: "progress", Usage: "show a progress bar (default: when stderr is a terminal; --progress=false: never)",
		EnvVars: []string{"RTARGET_PROGRESS"}}
}

// chunk is the unit of import and export: 256 blocks.
const chunk = 256 * store.BlockSize

func showProgress(c *cli.Context) bool {
	if c.IsSet("progress") {
		return c.Bool("progress")
	}
	fi, err := os.Stderr.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func volumeImport(c *cli.Context) error {
	return withStore(c, 2, func(ctx context.Context, st store.Store, a []string) error {
		f, err := os.Open(a[1])
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		size := fi.Size()
		vol, err := st.OpenVolume(ctx, a[0])
		if errors.Is(err, store.ErrNotFound) {
			vsize := (size + store.BlockSize - 1) / store.BlockSize * store.BlockSize
			if vsize == 0 {
				return fmt.Errorf("import %s: empty image", a[1])
			}
			if _, err = st.CreateVolume(ctx, a[0], vsize, map[string]string{"created-by": "rtarget volume import"}); err != nil {
				return fmt.Errorf("create %s: %w", a[0], err)
			}
			vol, err = st.OpenVolume(ctx, a[0])
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", a[0], err)
		}
		defer vol.Close()
		if size > vol.Info().Size {
			return fmt.Errorf("image %s (%d bytes) is larger than volume %s (%d bytes)", a[1], size, a[0], vol.Info().Size)
		}
		p := newProgress(c.App.ErrWriter, "import "+a[0], size, showProgress(c))
		buf := make([]byte, chunk)
		zero := make([]byte, store.BlockSize)
		var skipped int64
		for off := int64(0); off < size; off += chunk {
			n, err := io.ReadFull(f, buf)
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read %s: %w", a[1], err)
			}
			n = (n + store.BlockSize - 1) / store.BlockSize * store.BlockSize
			clear(buf[min(n, len(buf)):])
			// Sparse: all-zero blocks are written as zeroes (deleted keys).
			for b := 0; b < n; b += store.BlockSize {
				lba := uint64(off+int64(b)) / store.BlockSize
				if bytes.Equal(buf[b:b+store.BlockSize], zero) {
					if err := vol.WriteZeroes(ctx, lba, 1, false); err != nil {
						return err
					}
					skipped += store.BlockSize
					continue
				}
				end := b + store.BlockSize
				for end < n && !bytes.Equal(buf[end:end+store.BlockSize], zero) {
					end += store.BlockSize
				}
				if err := vol.WriteBlocks(ctx, lba, buf[b:end], false); err != nil {
					return err
				}
				b = end - store.BlockSize
			}
			p.add(int64(min(chunk, size-off)))
		}
		if err := vol.Flush(ctx); err != nil {
			return err
		}
		p.done(c.App.Writer, fmt.Sprintf("(%s of zero blocks not stored)", clix.FormatSize(skipped)))
		return nil
	})
}

func volumeExport(c *cli.Context) error {
	return withStore(c, 2, func(ctx context.Context, st store.Store, a []string) error {
		vol, err := st.OpenVolume(ctx, a[0])
		if err != nil {
			return fmt.Errorf("open %s: %w", a[0], err)
		}
		defer vol.Close()
		f, err := os.Create(a[1])
		if err != nil {
			return err
		}
		size := vol.Info().Size
		p := newProgress(c.App.ErrWriter, "export "+a[0], size, showProgress(c))
		buf := make([]byte, chunk)
		for off := int64(0); off < size; off += chunk {
			n := min(int64(chunk), size-off)
			if err := vol.ReadBlocks(ctx, uint64(off)/store.BlockSize, buf[:n]); err != nil {
				f.Close()
				return fmt.Errorf("read %s at %d: %w", a[0], off, err)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return err
			}
			p.add(n)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		p.done(c.App.Writer, "")
		return nil
	})
}

// progress draws a one-line progress bar on a terminal and a summary.
type progress struct {
	w          io.Writer
	what       string
	total, cur int64
	start      time.Time
	last       time.Time
	tty        bool
}

func newProgress(w io.Writer, what string, total int64, tty bool) *progress {
	return &progress{w: w, what: what, total: total, start: time.Now(), tty: tty}
}

func (p *progress) add(n int64) {
	p.cur += n
	if !p.tty || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 40
	frac := float64(p.cur) / float64(max(p.total, 1))
	bar := bytes.Repeat([]byte("#"), int(frac*width))
	fmt.Fprintf(p.w, "\r%s [%-*s] %5.1f%% %s/%s %s", p.what, width, bar, frac*100,
		clix.FormatSize(p.cur), clix.FormatSize(p.total), rate(p.cur, time.Since(p.start)))
}

func (p *progress) done(w io.Writer, note string) {
	if p.tty {
		fmt.Fprintln(p.w)
	}
	d := time.Since(p.start)
	fmt.Fprintf(w, "%s: %d bytes in %s, %s %s\n", p.what, p.cur, d.Round(time.Millisecond), rate(p.cur, d), note)
}

func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MB/s", float64(n)/d.Seconds()/1e6)
}
