package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
)

func volumeCommand() *cli.Command {
	flags := append([]cli.Flag{clix.ConfigFlag("RTARGET_")}, storeFlags()...)
	flags = append(flags, clix.LogFlags("RTARGET_")...)
	sub := func(name, usage, args string, action cli.ActionFunc, extra ...cli.Flag) *cli.Command {
		return &cli.Command{Name: name, Usage: usage, ArgsUsage: args, Flags: append(append([]cli.Flag{}, flags...), extra...),
			Before: clix.LoadSharedConfig, Action: action}
	}
	return &cli.Command{
		Name:  "volume",
		Usage: "manage the volumes of a store",
		Description: "While rtarget serve runs on the store, these commands ask it through its control socket (for the\n" +
			"thin store DATA/rtarget.sock): a volume created is served at once, a volume grown shows its new\n" +
			"size to initiators as they log in again; deleting, rolling back or shrinking a volume in use is\n" +
			"refused. When no daemon runs they open the store directly. import, export and migrate always open\n" +
			"it directly: stop rtarget serve first (or copy through rinit nbd with nbdcopy).\n\n" +
			"NAME@SNAP names snapshot SNAP of volume NAME. Sizes take K, M, G, T suffixes (powers of 1024).",
		Subcommands: []*cli.Command{
			sub("create", "create an empty (all-zero) thin volume of SIZE bytes, or with --raw serve an existing file or "+
				"block device as it is", "NAME SIZE | --raw PATH NAME", volumeCreate,
				&cli.StringFlag{Name: "raw", Usage: "serve this existing file or block device as the volume (its size is the file's)",
					EnvVars: []string{"RTARGET_RAW"}}),
			sub("list", "list volumes with their size, allocated bytes and snapshots", "", volumeList,
				&cli.BoolFlag{Name: "json", Usage: "print JSON (an array of volumes) instead of a table", EnvVars: []string{"RTARGET_JSON"}}),
			sub("delete", "delete a volume with its snapshots and all its data, or one snapshot", "NAME | NAME@SNAP", volumeDelete),
			sub("snapshot", "take a read-only snapshot of a volume (instant)", "NAME SNAP", volumeSnapshot),
			sub("clone", "create a writable volume from a snapshot (instant; shares data until written)", "NAME@SNAP NEWNAME",
				volumeClone),
			sub("rollback", "return a volume to a snapshot (content and size); the volume must not be in use", "NAME@SNAP",
				volumeRollback),
			sub("resize", "grow (also while in use) or, with --allow-shrink, shrink (discards the end; not while in use) a volume",
				"NAME SIZE", volumeResize,
				&cli.BoolFlag{Name: "allow-shrink", Usage: "allow SIZE below the volume's size: the data past SIZE is discarded " +
					"(snapshots keep theirs)", EnvVars: []string{"RTARGET_ALLOW_SHRINK"}}),
			sub("import", "copy a raw image into a volume (creates it with the image's size if missing)", "NAME FILE", volumeImport,
				progressFlag()),
			sub("export", "copy a volume or a snapshot out to a raw image file", "NAME[@SNAP] FILE", volumeExport, progressFlag()),
			{Name: "migrate", Usage: "convert a v1 store (one badger value per block) in --data into a thin store",
				Description: "Copies every volume of the v1 store into a new thin store (checking each block's CRC; a bad block\n" +
					"stops the migration and leaves the v1 store as it was), then moves the v1 files to DATA/v1 and\n" +
					"the thin store into DATA. Delete DATA/v1 once the volumes serve as they should. Needs free space\n" +
					"for the data written in the volumes. Names with '@' or '/' get '_' (listed). An interrupted\n" +
					"migration is finished by running it again. rtarget serve must be stopped.",
				Flags: append(append([]cli.Flag{}, flags...), progressFlag()), Before: clix.LoadSharedConfig, Action: volumeMigrate},
		},
	}
}

// volumeManager is what the volume commands need of a store.
type volumeManager interface {
	CreateVolume(ctx context.Context, name string, size int64, opts store.CreateOptions) (store.VolumeInfo, error)
	StatVolume(ctx context.Context, name string) (store.VolumeInfo, error)
	ListVolumes(ctx context.Context) ([]store.VolumeInfo, error)
	DeleteVolume(ctx context.Context, name string) error
	ResizeVolume(ctx context.Context, name string, size int64) error
	GrowVolume(ctx context.Context, name string, size int64) error
	CreateSnapshot(ctx context.Context, vol, snap string) (store.SnapshotInfo, error)
	DeleteSnapshot(ctx context.Context, vol, snap string) error
	Clone(ctx context.Context, vol, snap, newName string, opts store.CreateOptions) (store.VolumeInfo, error)
	Rollback(ctx context.Context, vol, snap string) error
	SetMeta(ctx context.Context, name string, meta map[string]string) error
}

var _ volumeManager = store.Store(nil)

func checkArgs(c *cli.Context, nargs int) error {
	if c.NArg() != nargs {
		return fmt.Errorf("%s: want %d argument(s): %s", c.Command.FullName(), nargs, c.Command.ArgsUsage)
	}
	return nil
}

// withStore opens the store for f.
func withStore(c *cli.Context, nargs int, f func(ctx context.Context, st store.Store, args []string) error) error {
	if err := checkArgs(c, nargs); err != nil {
		return err
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	st, err := openStore(c, log, false)
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("%w (rtarget serve or another volume command holds it)", err)
	}
	if err != nil {
		return err
	}
	err = f(c.Context, st, c.Args().Slice())
	if cerr := st.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close store: %w", cerr)
	}
	return err
}

// withManager runs f through the control socket of the rtarget serve
// holding the store, or on the store itself when none does.
func withManager(c *cli.Context, nargs int, f func(ctx context.Context, m volumeManager, args []string) error) error {
	if err := checkArgs(c, nargs); err != nil {
		return err
	}
	k, err := findStore(c.String("store"))
	if err != nil {
		return err
	}
	path := k.control(c)
	online := func() (bool, error) {
		if path == "" {
			return false, nil
		}
		cc, err := dialControl(path)
		if err != nil {
			return false, nil // no daemon answers: the store is ours to open
		}
		defer cc.close()
		return true, f(c.Context, cc, c.Args().Slice())
	}
	if ok, err := online(); ok {
		return err
	}
	err = withStore(c, nargs, func(ctx context.Context, st store.Store, args []string) error { return f(ctx, st, args) })
	if errors.Is(err, store.ErrLocked) {
		// A daemon took the store since we looked: ask it.
		if ok, err := online(); ok {
			return err
		}
		return fmt.Errorf("%w, and nothing answers on its control socket %s", err, path)
	}
	return err
}

// splitSnap parses NAME@SNAP.
func splitSnap(arg string) (vol, snap string, err error) {
	vol, snap, err = store.ParseRef(arg)
	if err == nil && snap == "" {
		err = errors.New("want NAME@SNAP")
	}
	if err != nil {
		return "", "", fmt.Errorf("%q: %w", arg, err)
	}
	return vol, snap, nil
}

func parseVolumeSize(s string) (int64, error) {
	n, err := clix.ParseSize(s)
	if err != nil {
		return 0, err
	}
	if n <= 0 || n%store.BlockSize != 0 {
		return 0, fmt.Errorf("size %s: must be a positive multiple of %d bytes", s, store.BlockSize)
	}
	return n, nil
}

func volumeCreate(c *cli.Context) error {
	raw := c.String("raw")
	nargs := 2
	if raw != "" {
		nargs = 1
	}
	return withManager(c, nargs, func(ctx context.Context, m volumeManager, a []string) error {
		var size int64
		if raw == "" {
			n, err := parseVolumeSize(a[1])
			if err != nil {
				return err
			}
			size = n
		} else if abs, err := filepath.Abs(raw); err == nil {
			raw = abs
		}
		info, err := m.CreateVolume(ctx, a[0], size, store.CreateOptions{Raw: raw,
			Meta: map[string]string{"created-by": "rtarget volume create"}})
		if err != nil {
			return fmt.Errorf("create %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "created %s volume %s (%s)\n", info.Kind, a[0], clix.FormatSize(info.Size))
		return nil
	})
}

func volumeMigrate(c *cli.Context) error {
	if err := checkArgs(c, 0); err != nil {
		return err
	}
	log, err := clix.Logger(c, os.Stderr)
	if err != nil {
		return err
	}
	opts, err := thinOptions(c, log)
	if err != nil {
		return err
	}
	var p *progress
	rep, err := store.MigrateV1(c.Context, c.String("data"), opts, func(vol string, done, total int64) {
		if p == nil || p.what != "migrate "+vol {
			p = newProgress(c.App.ErrWriter, "migrate "+vol, total, showProgress(c))
		}
		p.add(done - p.cur)
	})
	if err != nil {
		return err
	}
	for _, v := range rep.Volumes {
		renamed := ""
		if v.OldName != "" {
			renamed = fmt.Sprintf(" (was %q)", v.OldName)
		}
		fmt.Fprintf(c.App.Writer, "migrated %s%s: %s, %d blocks\n", v.Name, renamed, clix.FormatSize(v.Size), v.Blocks)
	}
	fmt.Fprintf(c.App.Writer, "the v1 files are in %s: delete them once the volumes serve as they should\n", rep.Backup)
	return nil
}

func volumeList(c *cli.Context) error {
	return withManager(c, 0, func(ctx context.Context, m volumeManager, _ []string) error {
		vs, err := m.ListVolumes(ctx)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return writeVolumesJSON(c.App.Writer, vs)
		}
		return writeVolumesTable(c.App.Writer, vs)
	})
}

func volumeDelete(c *cli.Context) error {
	return withManager(c, 1, func(ctx context.Context, m volumeManager, a []string) error {
		vol, snap, err := store.ParseRef(a[0])
		if err != nil {
			return fmt.Errorf("delete %q: %w", a[0], err)
		}
		if snap != "" {
			if err := m.DeleteSnapshot(ctx, vol, snap); err != nil {
				return fmt.Errorf("delete %s: %w", a[0], err)
			}
		} else if err := m.DeleteVolume(ctx, vol); err != nil {
			return fmt.Errorf("delete %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "deleted %s\n", a[0])
		return nil
	})
}

func volumeSnapshot(c *cli.Context) error {
	return withManager(c, 2, func(ctx context.Context, m volumeManager, a []string) error {
		start := time.Now()
		if _, err := m.CreateSnapshot(ctx, a[0], a[1]); err != nil {
			return fmt.Errorf("snapshot %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "created snapshot %s@%s in %s\n", a[0], a[1], time.Since(start).Round(time.Microsecond))
		return nil
	})
}

func volumeClone(c *cli.Context) error {
	return withManager(c, 2, func(ctx context.Context, m volumeManager, a []string) error {
		vol, snap, err := splitSnap(a[0])
		if err != nil {
			return err
		}
		info, err := m.Clone(ctx, vol, snap, a[1], store.CreateOptions{Meta: map[string]string{"created-by": "rtarget volume clone"}})
		if err != nil {
			return fmt.Errorf("clone %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "created clone %s of %s (%s)\n", a[1], a[0], clix.FormatSize(info.Size))
		return nil
	})
}

func volumeRollback(c *cli.Context) error {
	return withManager(c, 1, func(ctx context.Context, m volumeManager, a []string) error {
		vol, snap, err := splitSnap(a[0])
		if err != nil {
			return err
		}
		if err := m.Rollback(ctx, vol, snap); err != nil {
			return fmt.Errorf("rollback %s: %w", vol, err)
		}
		fmt.Fprintf(c.App.Writer, "rolled %s back to %s\n", vol, a[0])
		return nil
	})
}

func volumeResize(c *cli.Context) error {
	return withManager(c, 2, func(ctx context.Context, m volumeManager, a []string) error {
		n, err := parseVolumeSize(a[1])
		if err != nil {
			return err
		}
		// A shrink discards data, so it is asked for by name, as rbd resize
		// --allow-shrink and qemu-img resize --shrink ask: a mistyped size
		// must not cost the end of a disk. Without the flag the store
		// checks the size under its resize lock (GrowVolume), so a grow
		// that lands meanwhile is not cut back either.
		if !c.Bool("allow-shrink") {
			err := m.GrowVolume(ctx, a[0], n)
			if errors.Is(err, store.ErrShrink) {
				cur := "the volume's size"
				if vi, serr := m.StatVolume(ctx, a[0]); serr == nil {
					cur = "its " + clix.FormatSize(vi.Size)
				}
				return fmt.Errorf("resize %s: %s is smaller than %s, and the data past %s would be lost: "+
					"give --allow-shrink to shrink it", a[0], clix.FormatSize(n), cur, clix.FormatSize(n))
			}
			if err != nil {
				return fmt.Errorf("resize %s: %w", a[0], err)
			}
		} else if err := m.ResizeVolume(ctx, a[0], n); err != nil {
			return fmt.Errorf("resize %s: %w", a[0], err)
		}
		fmt.Fprintf(c.App.Writer, "resized %s to %s\n", a[0], clix.FormatSize(n))
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
		// The size by seeking to the end: stat says 0 for a block device.
		size, err := f.Seek(0, io.SeekEnd)
		if err == nil {
			_, err = f.Seek(0, io.SeekStart)
		}
		if err != nil {
			return fmt.Errorf("import %s: the image's size: %w", a[1], err)
		}
		vol, err := st.OpenVolume(ctx, a[0])
		if errors.Is(err, store.ErrNotFound) {
			vsize := (size + store.BlockSize - 1) / store.BlockSize * store.BlockSize
			if vsize == 0 {
				return fmt.Errorf("import %s: empty image", a[1])
			}
			if _, err = st.CreateVolume(ctx, a[0], vsize, store.CreateOptions{Meta: map[string]string{"created-by": "rtarget volume import"}}); err != nil {
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
			// Past the image's last byte, its last block reads zeros, not
			// what the chunk before left in buf.
			clear(buf[n:])
			n = (n + store.BlockSize - 1) / store.BlockSize * store.BlockSize
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
