package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listedVolume is what rtarget volume list --json says of a volume (the
// fields these tests read).
type listedVolume struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Size      int64  `json:"size"`
	Allocated int64  `json:"allocated"`
	Origin    string `json:"origin"`
	RawPath   string `json:"raw_path"`
	Snapshots []struct {
		Name   string   `json:"name"`
		Size   int64    `json:"size"`
		Clones []string `json:"clones"`
	} `json:"snapshots"`
}

func listVolumes(t *testing.T, rt, data string) map[string]listedVolume {
	t.Helper()
	out := run(t, time.Minute, rt, "volume", "list", "--json", "--data", data)
	var vs []listedVolume
	if err := json.Unmarshal([]byte(out), &vs); err != nil {
		t.Fatalf("volume list --json: %v\n%s", err, out)
	}
	m := map[string]listedVolume{}
	for _, v := range vs {
		m[v.Name] = v
	}
	return m
}

// fails runs a command that must fail, and returns its output.
func fails(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err == nil {
		t.Fatalf("%s %s succeeded:\n%s", name, strings.Join(args, " "), out)
	}
	return string(out)
}

// TestVolumeCommands runs every volume command in the forms the store
// issue names, on a store no daemon holds.
func TestVolumeCommands(t *testing.T) {
	rt, _ := bins(t)
	data := t.TempDir()
	raw := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(raw, bytes.Repeat([]byte{0xab}, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	d := []string{"--data", data}
	vc := func(args ...string) string {
		return run(t, time.Minute, rt, append(append([]string{"volume"}, args...), d...)...)
	}
	vc("create", "vol", "64M")
	vc("create", "--raw", raw, "img")
	// Data in vol, then a snapshot, a clone of it, more data, a rollback.
	img := filepath.Join(t.TempDir(), "in.img")
	randomFile(t, img, 4<<20)
	vc("import", "vol", img)
	vc("snapshot", "vol", "s1")
	vc("clone", "vol@s1", "copy")
	vc("resize", "vol", "128M")
	vs := listVolumes(t, rt, data)
	if v := vs["vol"]; v.Kind != "thin" || v.Size != 128<<20 || v.Allocated < 4<<20 || len(v.Snapshots) != 1 ||
		v.Snapshots[0].Name != "s1" || v.Snapshots[0].Size != 64<<20 || len(v.Snapshots[0].Clones) != 1 {
		t.Fatalf("vol listed as %+v", v)
	}
	if v := vs["copy"]; v.Origin != "vol@s1" || v.Size != 64<<20 {
		t.Fatalf("copy listed as %+v", v)
	}
	if v := vs["img"]; v.Kind != "raw" || v.Size != 3<<20 || v.RawPath != raw {
		t.Fatalf("img listed as %+v", v)
	}
	table := vc("list")
	for _, want := range []string{"vol@s1", "snapshot", "clones: copy", "raw", raw} {
		if !strings.Contains(table, want) {
			t.Errorf("volume list lacks %q:\n%s", want, table)
		}
	}
	// The snapshot and its clone hold the import; the head after rollback too.
	out := filepath.Join(t.TempDir(), "out.img")
	want := fileSum(t, img, 4<<20)
	for _, name := range []string{"vol@s1", "copy"} {
		vc("export", name, out)
		if fileSum(t, out, 4<<20) != want {
			t.Errorf("%s differs from what was imported", name)
		}
	}
	randomFile(t, img, 1<<20) // other data over the start
	vc("import", "vol", img)
	vc("rollback", "vol@s1")
	vc("export", "vol", out)
	if fileSum(t, out, 4<<20) != want {
		t.Error("vol after rollback differs from the snapshot")
	}
	if got := listVolumes(t, rt, data)["vol"].Size; got != 64<<20 {
		t.Errorf("vol's size after rollback: %d, want the snapshot's", got)
	}
	// A shrink is refused unless asked for by name, and changes nothing.
	if msg := fails(t, rt, append([]string{"volume", "resize", "vol", "2M"}, d...)...); !strings.Contains(msg, "--allow-shrink") {
		t.Errorf("shrink without --allow-shrink: %s", msg)
	}
	vc("export", "vol", out)
	if got := listVolumes(t, rt, data)["vol"].Size; got != 64<<20 || fileSum(t, out, 4<<20) != want {
		t.Errorf("a refused shrink changed vol: size %d, data same: %v", got, fileSum(t, out, 4<<20) == want)
	}
	vc("resize", "--allow-shrink", "vol", "2M")
	if got := listVolumes(t, rt, data)["vol"].Size; got != 2<<20 {
		t.Errorf("vol's size after resize --allow-shrink: %d, want %d", got, 2<<20)
	}
	vc("rollback", "vol@s1")
	if msg := fails(t, rt, append([]string{"volume", "delete", "vol@s1"}, d...)...); !strings.Contains(msg, "clones") {
		t.Errorf("deleting a snapshot with a clone: %s", msg)
	}
	// "vol@" (say "vol@$SNAP" with SNAP unset) deletes nothing.
	if msg := fails(t, rt, append([]string{"volume", "delete", "vol@"}, d...)...); !strings.Contains(msg, "NAME@SNAP") {
		t.Errorf("deleting vol@: %s", msg)
	}
	if _, ok := listVolumes(t, rt, data)["vol"]; !ok {
		t.Fatal("delete vol@ deleted vol")
	}
	vc("delete", "copy")
	vc("delete", "vol@s1")
	vc("delete", "vol")
	vc("delete", "img")
	if _, err := os.Stat(raw); err != nil {
		t.Errorf("deleting a raw volume touched its file: %v", err)
	}
	if vs := listVolumes(t, rt, data); len(vs) != 0 {
		t.Errorf("volumes left: %v", vs)
	}
	if msg := fails(t, rt, append([]string{"volume", "clone", "novol", "x"}, d...)...); !strings.Contains(msg, "NAME@SNAP") {
		t.Errorf("clone without @: %s", msg)
	}
}

// TestOnlineManagement: with rtarget serve running and fio writing and
// verifying through rinit, volumes are created (and served at once),
// snapshotted, cloned, grown (initiators logging in see the new size),
// and refused where a served volume must not change; fio ends without an
// error, and a snapshot taken after it, the volume and a clone of the
// snapshot read back the same.
func TestOnlineManagement(t *testing.T) {
	needTools(t, "fio", "nbdcopy")
	rt, ri := bins(t)
	data := t.TempDir()
	s := newStack(t, data)
	d := []string{"--data", data}
	vc := func(args ...string) string {
		return run(t, time.Minute, rt, append(append([]string{"volume"}, args...), d...)...)
	}
	info := func(vol string) string {
		return run(t, time.Minute, ri, "info", "--target", s.targetAddr, "--volume", vol)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fio := exec.CommandContext(ctx, "fio", "--name=online", "--ioengine=nbd", "--uri="+s.uri(), "--rw=randwrite", "--bs=4k",
		"--iodepth=16", "--size=192m", "--verify=crc32c", "--verify_backlog=256", "--verify_fatal=1",
		"--verify_state_save=0") // no state file left in the package directory
	var fioOut bytes.Buffer
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()

	steps := []func(){
		func() {
			vc("create", "fresh", "64M")
			if out := info("fresh"); !strings.Contains(out, "67108864") {
				t.Errorf("a volume created online is not served with its size:\n%s", out)
			}
		},
		func() { vc("snapshot", "vol", "s1") },
		func() {
			vc("clone", "vol@s1", "c1")
			if out := info("c1"); !strings.Contains(out, "536870912") {
				t.Errorf("a clone made online is not served:\n%s", out)
			}
		},
		func() {
			vc("resize", "fresh", "128M")
			if out := info("fresh"); !strings.Contains(out, "134217728") {
				t.Errorf("a grown volume does not show its new size at the next login:\n%s", out)
			}
		},
		func() { vc("snapshot", "vol", "s2") },
		func() {
			if msg := fails(t, rt, append([]string{"volume", "rollback", "vol@s1"}, d...)...); !strings.Contains(msg, "busy") {
				t.Errorf("rollback of a served volume: %s", msg)
			}
			if msg := fails(t, rt, append([]string{"volume", "delete", "vol"}, d...)...); !strings.Contains(msg, "busy") &&
				!strings.Contains(msg, "clones") {
				t.Errorf("delete of a served volume: %s", msg)
			}
			if msg := fails(t, rt, append([]string{"volume", "resize", "--allow-shrink", "vol", "256M"}, d...)...); !strings.Contains(msg, "busy") {
				t.Errorf("shrink of a served volume: %s", msg)
			}
		},
		func() { vc("delete", "vol@s2") },
		func() { vc("delete", "c1") },
		func() { vc("delete", "vol@s1") },
	}
	for i, step := range steps {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended before step %d: %v\n%s", i, err, fioOut.String())
		default:
		}
		step()
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-fioDone; err != nil {
		t.Fatalf("fio: %v\n%s", err, fioOut.String())
	}
	if strings.Contains(fioOut.String(), "verify") && strings.Contains(fioOut.String(), "bad") {
		t.Fatalf("fio reports verify errors:\n%s", fioOut.String())
	}
	t.Logf("fio wrote and verified 192 MiB while %d volume commands ran", len(steps))

	// Quiet now: a snapshot, the volume and a clone of the snapshot read
	// the same.
	vc("snapshot", "vol", "final")
	vc("clone", "vol@final", "c2")
	dir := t.TempDir()
	var sums [][32]byte
	for _, name := range []string{"vol", "vol@final", "c2"} {
		addr := freePort(t)
		p := start(t, ri, "nbd", "--target", s.targetAddr, "--volume", name, "--listen", addr, "--name", "copy-"+name)
		waitPort(t, addr, p)
		out := filepath.Join(dir, strings.ReplaceAll(name, "@", "_"))
		run(t, 2*time.Minute, "nbdcopy", "nbd://"+addr+"/"+name, out)
		sums = append(sums, fileSum(t, out, 512<<20))
		p.stop(15, 30*time.Second)
	}
	if sums[0] != sums[1] || sums[1] != sums[2] {
		t.Fatal("the volume, its snapshot and the snapshot's clone differ")
	}
}
