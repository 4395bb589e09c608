package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
)

// TestVolumeImportPartialLastBlock: an image whose size is not a whole
// number of blocks (an ISO image is one of 2 KiB sectors) is imported with
// zeros after its last byte, never with bytes of the chunk read before it.
func TestVolumeImportPartialLastBlock(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "store")
	img := filepath.Join(dir, "disk.iso")
	content := append(bytes.Repeat([]byte{0xaa}, chunk), bytes.Repeat([]byte{0xbb}, 2048)...)
	if err := os.WriteFile(img, content, 0o600); err != nil {
		t.Fatal(err)
	}
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	args := []string{"rtarget", "volume", "import", "--data", data, "--progress=false", "v", img}
	if err := app.Run(clix.FlagsFirst(app, args)); err != nil {
		t.Fatalf("import: %v", err)
	}
	st, err := store.OpenThin(data, store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	v, err := st.OpenVolume(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	want := append(content, make([]byte, 2048)...)
	if got := v.Info().Size; got != int64(len(want)) {
		t.Fatalf("volume of %d bytes, want %d", got, len(want))
	}
	got := make([]byte, len(want))
	if err := v.ReadBlocks(ctx, 0, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("byte %d of the volume is %#x, want %#x (image of %d bytes)", i, got[i], want[i], len(content))
		}
	}
}

// runRtarget runs the rtarget command line args (without the program
// name) in this process, its output discarded.
func runRtarget(t *testing.T, args ...string) {
	t.Helper()
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	if err := app.Run(clix.FlagsFirst(app, append([]string{"rtarget"}, args...))); err != nil {
		t.Fatalf("rtarget %q: %v", args, err)
	}
}

// TestImportBlockDevice: a block device is imported whole (its size comes
// from the device, not from stat, which says 0): into a new volume of its
// size, and into an existing one. As root with losetup; skipped otherwise.
func TestImportBlockDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a loop device")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "dev.img")
	image := bytes.Repeat([]byte{0x42}, 1<<20)
	if err := os.WriteFile(img, image, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })

	data := filepath.Join(dir, "data")
	runRtarget(t, "volume", "create", "--data", data, "old", "1M")
	for _, vol := range []string{"old", "new"} {
		runRtarget(t, "volume", "import", "--data", data, "--progress=false", vol, loop)
		exp := filepath.Join(dir, vol+".out")
		runRtarget(t, "volume", "export", "--data", data, "--progress=false", vol, exp)
		got, err := os.ReadFile(exp)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, image) {
			t.Errorf("volume %s after importing %s: %d bytes, %d of them 0x42; want the device's %d bytes of 0x42",
				vol, loop, len(got), bytes.Count(got, []byte{0x42}), len(image))
		}
	}
}

// TestVolumeCommandsMemoryStore: the memory store lives inside rtarget
// serve only, and serve has no control socket for it: a volume command
// with --store memory would act on an empty store of its own that is gone
// when it exits, so it fails instead of reporting a change nobody sees.
func TestVolumeCommandsMemoryStore(t *testing.T) {
	for _, args := range [][]string{
		{"volume", "create", "--store", "memory", "v", "1M"},
		{"volume", "list", "--store", "memory"},
		{"volume", "delete", "--store", "memory", "v"},
	} {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		err := app.Run(append([]string{"rtarget"}, args...))
		if err == nil || !strings.Contains(err.Error(), "memory") {
			t.Errorf("rtarget %q: %v, want an error about the memory store", args, err)
		}
	}
}

// TestServeBadListenAddress: a --listen that is no host:port is refused as
// such, a usage error, before anything is opened; it used to be taken for
// a non-loopback address and refused for want of --secret-file.
func TestServeBadListenAddress(t *testing.T) {
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	err := app.Run([]string{"rtarget", "serve", "--store", "memory", "--volume", "v:1M", "--data", t.TempDir(), "--listen", "bogus"})
	var ue *clix.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), `--listen "bogus"`) {
		t.Fatalf("serve --listen bogus: %v, want a usage error naming --listen", err)
	}
}

// TestVolumeCommandsReadServeConfig: the volume commands read the config
// file written for rtarget serve (deploy/rtarget.conf, and one naming the
// store), taking the settings they know (data, store, log-level) and
// passing over serve's (listen, volume, metrics-listen, drain-timeout);
// a setting no rtarget command has is still an error, naming it.
func TestVolumeCommandsReadServeConfig(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	// The shipped sample, its --data (/var/lib/rtarget) given on the
	// command line, which wins over the file.
	sample, err := filepath.Abs("../../deploy/rtarget.conf")
	if err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, status := execRtarget(t, "volume", "list", "--config", sample, "--data", data); status != 0 {
		t.Fatalf("volume list --config %s: status %d\n%s%s", sample, status, stdout, stderr)
	}
	conf := filepath.Join(dir, "rtarget.conf")
	write := func(extra string) {
		t.Helper()
		text := "listen = 127.0.0.1:4420\ndata = " + data + "\nstore = thin\nvolume = disk0:10G\n" +
			"metrics-listen = 127.0.0.1:9420\ndrain-timeout = 60s\nlog-level = warn\n" + extra
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	if _, stderr, status := execRtarget(t, "volume", "create", "--config", conf, "v", "1M"); status != 0 {
		t.Fatalf("volume create --config: status %d\n%s", status, stderr)
	}
	stdout, stderr, status := execRtarget(t, "volume", "list", "--config", conf, "--json")
	if status != 0 || !strings.Contains(stdout, `"name": "v"`) {
		t.Fatalf("volume list --config: status %d, want v, created in the config's data directory\n%s%s", status, stdout, stderr)
	}
	write("lisen = 127.0.0.1:4420\n")
	for _, args := range [][]string{{"volume", "list"}, {"serve"}} {
		_, stderr, status = execRtarget(t, append(args, "--config", conf)...)
		if status == 0 || !strings.Contains(stderr, `unknown setting "lisen"`) {
			t.Errorf("rtarget %s with a config holding a typo: status %d, want an error naming it\n%s", args, status, stderr)
		}
	}
}
