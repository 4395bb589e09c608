package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/rnic-dev/rnic/store"
)

// ModelOptions configure Model.
type ModelOptions struct {
	// Open opens a new, empty store.
	Open func(t *testing.T) store.Store
	// Reopen, if set, closes s and opens the same store again: the model
	// is then also checked across reopens.
	Reopen func(t *testing.T, s store.Store) store.Store
	// Check, if set, checks the backend's own invariants (no cluster
	// leaked, reference counts right) after each step.
	Check func(t *testing.T, s store.Store)
	// Steps is the number of random operations; 0 means 400.
	Steps int
	// Seed of the operations; 0 means one from RNIC_MODEL_SEED or the
	// clock.
	Seed uint64
	// Blocks is the largest volume size in blocks; 0 means 96.
	Blocks int
}

// modelVol is what a volume must hold.
type modelVol struct {
	data  []byte
	snaps map[string][]byte
	order []string // snapshot names, oldest first
}

// Model runs random writes, trims, write-zeroes, resizes, snapshots,
// clones, rollbacks and deletes (of volumes, and of snapshots anywhere in
// a chain) against a store and an in-memory model, and checks every
// volume and snapshot against the model after each step (and after each
// reopen when Reopen is set).
func Model(t *testing.T, o ModelOptions) {
	if o.Steps == 0 {
		o.Steps = 400
	}
	if o.Blocks == 0 {
		o.Blocks = 96
	}
	seed := o.Seed
	if seed == 0 {
		if v := os.Getenv("RNIC_MODEL_SEED"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("RNIC_MODEL_SEED=%q: %v", v, err)
			}
			seed = n
		} else {
			seed = rand.Uint64()
		}
	}
	t.Logf("RNIC_MODEL_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x6d6f64656c))
	ctx := context.Background()
	st := o.Open(t)
	defer func() { st.Close() }()
	vols := map[string]*modelVol{}
	origin := map[string]string{} // clone -> "vol@snap"
	tag := uint64(0)
	nextName := 0
	name := func(p string) string { nextName++; return fmt.Sprintf("%s%d", p, nextName) }
	names := func() []string {
		var out []string
		for n := range vols {
			out = append(out, n)
		}
		sort.Strings(out)
		return out
	}
	pick := func() string {
		ns := names()
		if len(ns) == 0 {
			return ""
		}
		return ns[rng.IntN(len(ns))]
	}
	hasClones := func(ref string) bool {
		for _, o := range origin {
			if o == ref {
				return true
			}
		}
		return false
	}
	open := func(n string) store.Volume {
		t.Helper()
		v, err := st.OpenVolume(ctx, n)
		if err != nil {
			t.Fatalf("seed %d: open %s: %v", seed, n, err)
		}
		return v
	}
	fail := func(step int, what string, err error) {
		t.Helper()
		t.Fatalf("seed %d step %d: %s: %v", seed, step, what, err)
	}
	check := func(step int, what string) {
		t.Helper()
		list, err := st.ListVolumes(ctx)
		if err != nil {
			fail(step, "list", err)
		}
		if len(list) != len(vols) {
			t.Fatalf("seed %d step %d (%s): %d volumes listed, model has %d", seed, step, what, len(list), len(vols))
		}
		for _, info := range list {
			mv := vols[info.Name]
			if mv == nil {
				t.Fatalf("seed %d step %d (%s): unknown volume %s listed", seed, step, what, info.Name)
			}
			if info.Size != int64(len(mv.data)) {
				t.Fatalf("seed %d step %d (%s): %s size %d, model %d", seed, step, what, info.Name, info.Size, len(mv.data))
			}
			var snaps []string
			for _, s := range info.Snapshots {
				snaps = append(snaps, s.Name)
			}
			if !slices.Equal(snaps, mv.order) {
				t.Fatalf("seed %d step %d (%s): %s snapshots %v, model %v", seed, step, what, info.Name, snaps, mv.order)
			}
			if info.Origin != origin[info.Name] {
				t.Fatalf("seed %d step %d (%s): %s origin %q, model %q", seed, step, what, info.Name, info.Origin, origin[info.Name])
			}
			checkContent(t, st, info.Name, mv.data, fmt.Sprintf("seed %d step %d (%s)", seed, step, what))
			for _, s := range mv.order {
				checkContent(t, st, info.Name+"@"+s, mv.snaps[s], fmt.Sprintf("seed %d step %d (%s)", seed, step, what))
			}
		}
		if o.Check != nil {
			o.Check(t, st)
		}
	}
	for step := 0; step < o.Steps; step++ {
		var what string
		switch op := rng.IntN(100); {
		case op < 8 || len(vols) == 0:
			if len(vols) >= 6 {
				continue
			}
			n := name("v")
			size := (8 + rng.IntN(o.Blocks-7)) * bs
			if _, err := st.CreateVolume(ctx, n, int64(size), store.CreateOptions{}); err != nil {
				fail(step, "create", err)
			}
			vols[n] = &modelVol{data: make([]byte, size), snaps: map[string][]byte{}}
			what = "create " + n
		case op < 40:
			n := pick()
			mv := vols[n]
			blocks := len(mv.data) / bs
			lba := rng.IntN(blocks)
			cnt := 1 + rng.IntN(min(blocks-lba, 24))
			tag++
			p := Pattern(uint64(lba), cnt, tag)
			v := open(n)
			if err := v.WriteBlocks(ctx, uint64(lba), p, rng.IntN(8) == 0); err != nil {
				fail(step, "write", err)
			}
			v.Close()
			copy(mv.data[lba*bs:], p)
			what = fmt.Sprintf("write %s %d+%d", n, lba, cnt)
		case op < 52:
			n := pick()
			mv := vols[n]
			blocks := len(mv.data) / bs
			lba := rng.IntN(blocks)
			cnt := 1 + rng.IntN(blocks-lba)
			v := open(n)
			var err error
			switch rng.IntN(3) {
			case 0:
				err = v.Trim(ctx, uint64(lba), uint64(cnt))
			case 1:
				err = v.WriteZeroes(ctx, uint64(lba), uint64(cnt), rng.IntN(4) == 0)
			default:
				err = v.WriteZeroesAllocated(ctx, uint64(lba), uint64(cnt), rng.IntN(4) == 0)
			}
			v.Close()
			if err != nil {
				fail(step, "discard", err)
			}
			clear(mv.data[lba*bs : (lba+cnt)*bs])
			what = fmt.Sprintf("discard %s %d+%d", n, lba, cnt)
		case op < 64:
			n := pick()
			mv := vols[n]
			if len(mv.order) >= 4 {
				continue
			}
			s := name("s")
			if _, err := st.CreateSnapshot(ctx, n, s); err != nil {
				fail(step, "snapshot", err)
			}
			mv.snaps[s] = slices.Clone(mv.data)
			mv.order = append(mv.order, s)
			what = "snapshot " + n + "@" + s
		case op < 72:
			n := pick()
			mv := vols[n]
			if len(mv.order) == 0 || len(vols) >= 6 {
				continue
			}
			s := mv.order[rng.IntN(len(mv.order))]
			c := name("c")
			if _, err := st.Clone(ctx, n, s, c, store.CreateOptions{}); err != nil {
				fail(step, "clone", err)
			}
			vols[c] = &modelVol{data: slices.Clone(mv.snaps[s]), snaps: map[string][]byte{}}
			origin[c] = n + "@" + s
			what = "clone " + n + "@" + s + " to " + c
		case op < 80:
			n := pick()
			mv := vols[n]
			if len(mv.order) == 0 {
				continue
			}
			s := mv.order[rng.IntN(len(mv.order))]
			if err := st.Rollback(ctx, n, s); err != nil {
				fail(step, "rollback", err)
			}
			mv.data = slices.Clone(mv.snaps[s])
			what = "rollback " + n + "@" + s
		case op < 88:
			n := pick()
			mv := vols[n]
			if len(mv.order) == 0 {
				continue
			}
			i := rng.IntN(len(mv.order))
			s := mv.order[i]
			err := st.DeleteSnapshot(ctx, n, s)
			if hasClones(n + "@" + s) {
				if !errors.Is(err, store.ErrHasDependents) {
					fail(step, "delete snapshot with clones", err)
				}
				continue
			}
			if err != nil {
				fail(step, "delete snapshot", err)
			}
			delete(mv.snaps, s)
			mv.order = slices.Delete(mv.order, i, i+1)
			what = "delete " + n + "@" + s
		case op < 93:
			n := pick()
			mv := vols[n]
			dep := false
			for _, s := range mv.order {
				dep = dep || hasClones(n+"@"+s)
			}
			err := st.DeleteVolume(ctx, n)
			if dep {
				if !errors.Is(err, store.ErrHasDependents) {
					fail(step, "delete volume with clones", err)
				}
				continue
			}
			if err != nil {
				fail(step, "delete volume", err)
			}
			delete(vols, n)
			delete(origin, n)
			what = "delete " + n
		case op < 97:
			n := pick()
			mv := vols[n]
			size := (8 + rng.IntN(o.Blocks-7)) * bs
			if err := st.ResizeVolume(ctx, n, int64(size)); err != nil {
				fail(step, "resize", err)
			}
			if size < len(mv.data) {
				mv.data = mv.data[:size]
			} else {
				mv.data = append(mv.data, make([]byte, size-len(mv.data))...)
			}
			what = fmt.Sprintf("resize %s to %d blocks", n, size/bs)
		default:
			if o.Reopen == nil {
				continue
			}
			st = o.Reopen(t, st)
			what = "reopen"
		}
		check(step, what)
	}
	if o.Reopen != nil {
		st = o.Reopen(t, st)
		check(o.Steps, "final reopen")
	}
	// Delete everything: the backend's check then sees an empty store.
	for len(vols) > 0 {
		for _, n := range names() {
			if len(clonesOfModel(origin, n)) > 0 {
				continue
			}
			if err := st.DeleteVolume(ctx, n); err != nil {
				t.Fatalf("seed %d: final delete %s: %v", seed, n, err)
			}
			delete(vols, n)
			delete(origin, n)
		}
	}
	check(o.Steps+1, "all deleted")
}

func clonesOfModel(origin map[string]string, vol string) []string {
	var out []string
	for c, o := range origin {
		if v, _ := store.SplitSnapshot(o); v == vol {
			out = append(out, c)
		}
	}
	return out
}

func checkContent(t *testing.T, st store.Store, name string, want []byte, when string) {
	t.Helper()
	v, err := st.OpenVolume(context.Background(), name)
	if err != nil {
		t.Fatalf("%s: open %s: %v", when, name, err)
	}
	defer v.Close()
	if got := v.Info().Size; got != int64(len(want)) {
		t.Fatalf("%s: %s has %d bytes, model %d", when, name, got, len(want))
	}
	got := make([]byte, len(want))
	if err := v.ReadBlocks(context.Background(), 0, got); err != nil {
		t.Fatalf("%s: read %s: %v", when, name, err)
	}
	for i := 0; i < len(got); i += bs {
		if !slices.Equal(got[i:i+bs], want[i:i+bs]) {
			gt, gok := BlockTag(got[i:i+bs], uint64(i/bs))
			wt, _ := BlockTag(want[i:i+bs], uint64(i/bs))
			t.Fatalf("%s: %s block %d holds tag %d (valid %v), model %d", when, name, i/bs, gt, gok, wt)
		}
	}
	// TryReadBlocks, where it reads, reads the same, a block at a time and
	// across cluster-sized runs.
	for _, n := range []int{1, 16} {
		buf := make([]byte, n*bs)
		for i := 0; i+len(buf) <= len(want); i += len(buf) {
			if v.TryReadBlocks(uint64(i/bs), buf) && !slices.Equal(buf, want[i:i+len(buf)]) {
				t.Fatalf("%s: TryReadBlocks of %s, %d blocks at %d, differs from the model", when, name, n, i/bs)
			}
		}
	}
	var holes []store.Extent
	err = v.BlockStatus(context.Background(), 0, uint64(len(want)/bs), func(e store.Extent) bool {
		if e.Hole {
			holes = append(holes, e)
		}
		return true
	})
	if err != nil {
		t.Fatalf("%s: block status %s: %v", when, name, err)
	}
	for _, e := range holes {
		if !IsZero(want[e.LBA*bs : (e.LBA+e.Count)*bs]) {
			t.Fatalf("%s: %s reports a hole at %d+%d over data", when, name, e.LBA, e.Count)
		}
	}
}
