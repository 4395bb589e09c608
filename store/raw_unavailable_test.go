package store_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// TestRawVolumeUnavailable: a raw volume whose file is gone (deleted, or
// cut to less than a block, as a detached loop device reads) is listed
// and stated as unavailable with the cause, beside the other volumes,
// instead of failing the whole listing; opening it fails naming its path;
// it can be deleted; once the file is back it serves again. The store,
// reopened meanwhile, opens as usual.
func TestRawVolumeUnavailable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := store.OpenThin(filepath.Join(dir, "store"), store.ThinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	gone, empty := filepath.Join(dir, "gone.img"), filepath.Join(dir, "empty.img")
	for _, p := range []string{gone, empty} {
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateVolume(ctx, filepath.Base(p), 0, store.CreateOptions{Raw: p}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateVolume(ctx, "thin", 1<<20, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(empty, 0); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		vs, err := s.ListVolumes(ctx)
		if err != nil {
			t.Fatalf("%s: list with a raw volume's file gone: %v", when, err)
		}
		if len(vs) != 3 || vs[2].Name != "thin" || vs[2].Unavailable != "" || vs[2].Size != 1<<20 {
			t.Fatalf("%s: list: %+v, want the two raw volumes and thin, which is available", when, vs)
		}
		for i, p := range []string{empty, gone} {
			v := vs[i]
			if v.Name != filepath.Base(p) || v.Kind != store.KindRaw || v.RawPath != p {
				t.Fatalf("%s: listed %+v, want raw volume %s on %s", when, v, filepath.Base(p), p)
			}
			if !strings.Contains(v.Unavailable, p) || v.Size != 0 || v.Allocated != 0 {
				t.Errorf("%s: listed %s as unavailable %q, size %d, allocated %d: want the cause naming %s, size 0 (unknown)",
					when, v.Name, v.Unavailable, v.Size, v.Allocated, p)
			}
			st, err := s.StatVolume(ctx, v.Name)
			if err != nil || st.Unavailable != v.Unavailable {
				t.Errorf("%s: stat %s: %v, unavailable %q, want %q", when, v.Name, err, st.Unavailable, v.Unavailable)
			}
			_, err = s.OpenVolume(ctx, v.Name)
			if err == nil || !strings.Contains(err.Error(), p) {
				t.Errorf("%s: open %s: %v, want an error naming %s", when, v.Name, err, p)
			}
		}
		if _, err := s.OpenVolume(ctx, "gone.img"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: open of the volume whose file was deleted: %v, want fs.ErrNotExist", when, err)
		}
	}
	check("open")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = store.OpenThin(filepath.Join(dir, "store"), store.ThinOptions{}); err != nil {
		t.Fatalf("reopen with a raw volume's file gone: %v", err)
	}
	check("reopened")

	if err := os.WriteFile(gone, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := s.StatVolume(ctx, "gone.img")
	if err != nil || st.Unavailable != "" || st.Size != 2<<20 {
		t.Fatalf("stat once the file is back: %v, %+v, want it available with the file's size", err, st)
	}
	v, err := s.OpenVolume(ctx, "gone.img")
	if err != nil {
		t.Fatalf("open once the file is back: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "empty.img"); err != nil {
		t.Fatalf("delete of an unavailable raw volume: %v", err)
	}
	if vs, err := s.ListVolumes(ctx); err != nil || len(vs) != 2 {
		t.Fatalf("list after the delete: %v, %+v", err, vs)
	}
	store.CheckThin(t, s)
}
