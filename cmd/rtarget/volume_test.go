package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
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
