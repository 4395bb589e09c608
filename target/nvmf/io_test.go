package nvmf

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"

	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
)

// TestFlushTrimZeroes on the thin store: Flush and FUA writes reach the store's
// sync (its Syncs counter), Dataset Management with Deallocate trims
// (the blocks read as zeros, the trim counter moves), without it nothing
// happens, and Write Zeroes zeroes.
// With WriteBack (the store's write-back cache in front) a plain write does
// not sync the store; by default every write does.
func TestFlushTrimZeroes(t *testing.T) {
	e := newTestEnv(t, envOpts{thin: true, cfg: func(c *Config) { c.WriteBack = true }})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	sy := e.st.(store.Syncer)
	data := make([]byte, 16*store.BlockSize)
	rand.Read(data)
	before := sy.Syncs()
	if st, err := h.write(0, 100, data, true); err != nil || st != StatusSuccess {
		t.Fatalf("write: %v %v", st, err)
	}
	if sy.Syncs() != before {
		t.Fatal("a write without FUA synced the store under WriteBack")
	}
	before = sy.Syncs()
	if r, _, err := h.io[0].do(CommandFields{Opcode: IOFlush, NSID: 0xffffffff}, cmdOpts{}); err != nil || r.status() != StatusSuccess {
		t.Fatalf("flush: %v %v", r.status(), err)
	}
	if sy.Syncs() == before {
		t.Fatal("Flush did not sync the store")
	}
	before = sy.Syncs()
	f := rw(IOWrite, 200, 1)
	f.CDW10_15[2] |= 1 << 30 // FUA
	if r, _, err := h.io[0].do(f, cmdOpts{dir: dirFromHost, data: data[:store.BlockSize], inCapsule: true}); err != nil ||
		r.status() != StatusSuccess {
		t.Fatalf("FUA write: %v %v", r.status(), err)
	}
	if sy.Syncs() == before {
		t.Fatal("a FUA write did not sync the store")
	}
	// Deallocate blocks 104-107; a DSM without AD changes nothing.
	o := dsmOpts(104, 4)
	if r, _, err := h.io[0].do(dsm(false), o); err != nil || r.status() != StatusSuccess {
		t.Fatalf("DSM without deallocate: %v %v", r.status(), err)
	}
	if got, _, _ := h.read(0, 100, 16); !bytes.Equal(got, data) {
		t.Fatal("DSM without deallocate changed data")
	}
	trims := e.srv.m.Ops[target.OpTrim].Load()
	if r, _, err := h.io[0].do(dsm(true), dsmOpts(104, 4)); err != nil || r.status() != StatusSuccess {
		t.Fatalf("deallocate: %v %v", r.status(), err)
	}
	if e.srv.m.Ops[target.OpTrim].Load() != trims+1 {
		t.Fatalf("trim counter %d -> %d", trims, e.srv.m.Ops[target.OpTrim].Load())
	}
	want := append([]byte(nil), data...)
	clear(want[4*store.BlockSize : 8*store.BlockSize])
	if got, _, _ := h.read(0, 100, 16); !bytes.Equal(got, want) {
		t.Fatal("deallocated blocks do not read as zeros, or others changed")
	}
	// Write Zeroes of blocks 110-111, FUA.
	wz := rw(IOWriteZeroes, 110, 2)
	wz.CDW10_15[2] |= 1<<25 | 1<<30
	if r, _, err := h.io[0].do(wz, cmdOpts{}); err != nil || r.status() != StatusSuccess {
		t.Fatalf("write zeroes: %v %v", r.status(), err)
	}
	clear(want[10*store.BlockSize : 12*store.BlockSize])
	if got, _, _ := h.read(0, 100, 16); !bytes.Equal(got, want) {
		t.Fatal("Write Zeroes")
	}
	// Ranges out of the namespace are refused before anything is trimmed.
	b := dsmOpts(0, 1)
	copy(b.data[16:], b.data[:16])
	b.data[16+4] = 8
	b.data[16+8], b.data[16+9], b.data[16+10] = 0xff, 0xff, 0xff
	f = dsm(true)
	f.CDW10_15[0] = 1 // two ranges
	if r, _, err := h.io[0].do(f, b); err != nil || r.status() != StatusLBARange|StatusDNR {
		t.Fatalf("deallocate out of range: %v %v", r.status(), err)
	}
}

// TestWriteThrough: by default every write and write-zeroes is durable
// before its completion (a crash of the target must not lose what it
// acknowledged: the host replays its Flush to the next incarnation).
func TestWriteThrough(t *testing.T) {
	e := newTestEnv(t, envOpts{thin: true})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	sy := e.st.(store.Syncer)
	for i, keyed := range []bool{false, true} {
		before := sy.Syncs()
		if st, err := h.write(0, uint64(10*i), make([]byte, 2*store.BlockSize), keyed); err != nil || st != StatusSuccess {
			t.Fatalf("write: %v %v", st, err)
		}
		if sy.Syncs() == before {
			t.Fatalf("write (keyed %v) completed before the store synced", keyed)
		}
	}
	before := sy.Syncs()
	if r, _, err := h.io[0].do(rw(IOWriteZeroes, 40, 8), cmdOpts{}); err != nil || r.status() != StatusSuccess || sy.Syncs() == before {
		t.Fatalf("write zeroes: %v %v, syncs %d -> %d", r.status(), err, before, sy.Syncs())
	}
}

// TestStoreErrorStatus: what the host sees for the store's refusals that
// are its answer, not a fault of the target.
func TestStoreErrorStatus(t *testing.T) {
	c := &controller{}
	for _, tc := range []struct {
		err  error
		want Status
	}{
		{fmt.Errorf("store: write volume \"v\": cluster 9: %w", store.ErrNoSpace), StatusCapExceeded | StatusDNR},
		{fmt.Errorf("wrapped: %w", store.ErrOutOfRange), StatusLBARange | StatusDNR},
		{fmt.Errorf("wrapped: %w", target.ErrReadOnly), StatusNSWriteProtected | StatusDNR},
	} {
		var se *StatusError
		if err := c.storeError(nil, "write", tc.err); !errors.As(err, &se) || se.Status != tc.want {
			t.Errorf("storeError(%v) = %v, want status %#x", tc.err, err, uint16(tc.want))
		}
	}
}

// TestVolumeGrownWhileServed: a volume grown while hosts are connected
// (rtarget volume resize: the store lets open handles see the new size
// at once) is that size for NVMe too. Identify Namespace reports it to a
// host that rescans, I/O reaches the new blocks, and a host connecting
// later, while the volume is still open, gets it from the start.
func TestVolumeGrownWhileServed(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	const oldBlocks, newBlocks = 64 << 20 / store.BlockSize, 128 << 20 / store.BlockSize
	if err := e.st.GrowVolume(context.Background(), "vol0", newBlocks*store.BlockSize); err != nil {
		t.Fatal(err)
	}
	for i, host := range []*testHost{h, connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})} {
		b, st, err := host.identify(CNSNamespace, 1)
		if err != nil || st != StatusSuccess {
			t.Fatalf("host %d: Identify Namespace: %v %v", i, st, err)
		}
		if ns := IdentifyNamespace(b); ns.NSZE() != newBlocks || ns.NCAP() != newBlocks {
			t.Errorf("host %d: NSZE %d NCAP %d after the volume grew to %d blocks", i, ns.NSZE(), ns.NCAP(), newBlocks)
		}
		data := make([]byte, 2*store.BlockSize)
		rand.Read(data)
		lba := uint64(oldBlocks + 16*i)
		if st, err := host.write(0, lba, data, true); err != nil || st != StatusSuccess {
			t.Fatalf("host %d: write at LBA %d of the grown volume: %v %v", i, lba, st, err)
		}
		if got, st, err := host.read(0, lba, 2); err != nil || st != StatusSuccess || !bytes.Equal(got, data) {
			t.Fatalf("host %d: read back at LBA %d: %v %v", i, lba, st, err)
		}
	}
	// The end is still the end.
	if st, _ := h.write(0, newBlocks-1, make([]byte, 2*store.BlockSize), true); st != StatusLBARange|StatusDNR {
		t.Fatalf("write across the new end: %v", st)
	}
}

// TestMDTSIsTheLimit: for every MaxTransfer New accepts, Identify
// Controller's MDTS tells the host a limit the controller keeps: a host
// that sends the largest transfer MDTS allows (its own limit, 256 KiB
// here, when MDTS is 0: no limit) gets it done. MDTS counts in powers of
// two of 4 KiB pages and 0 means no limit, so 4 KiB itself cannot be
// said.
func TestMDTSIsTheLimit(t *testing.T) {
	probe := newTestEnv(t, envOpts{})
	const hostLimit = 256 << 10
	for _, mt := range []int{store.BlockSize, 2 * store.BlockSize, 64 << 10} {
		t.Run(fmt.Sprint(mt), func(t *testing.T) {
			cfg := probe.cfg
			if _, err := New(cfg.with(func(c *Config) { c.MaxTransfer = mt })); err != nil {
				t.Logf("MaxTransfer %d refused: %v", mt, err)
				return
			}
			e := newTestEnv(t, envOpts{cfg: func(c *Config) { c.MaxTransfer = mt }})
			h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
			b, st, err := h.identify(CNSController, 0)
			if err != nil || st != StatusSuccess {
				t.Fatalf("Identify Controller: %v %v", st, err)
			}
			limit := hostLimit
			if m := IdentifyController(b).MDTS(); m != 0 {
				limit = min(limit, store.BlockSize<<m)
			}
			data := make([]byte, limit)
			rand.Read(data)
			if st, err := h.write(0, 0, data, true); err != nil || st != StatusSuccess {
				t.Fatalf("MaxTransfer %d, MDTS %d: write of %d bytes: %v %v", mt, IdentifyController(b).MDTS(), limit, st, err)
			}
			if got, st, err := h.read(0, 0, limit/store.BlockSize); err != nil || st != StatusSuccess || !bytes.Equal(got, data) {
				t.Fatalf("MaxTransfer %d: read of %d bytes: %v %v", mt, limit, st, err)
			}
		})
	}
}

// with returns a copy of c changed by fn.
func (c Config) with(fn func(*Config)) Config { fn(&c); return c }

// TestReadOnlyNamespaceSaysSo: a volume that refuses writes (a snapshot,
// served as VOL@SNAP) is reported write protected in Identify Namespace
// (NSATTR bit 0), so the host makes its block device read-only instead of
// failing every write it sends; the writes are still refused.
func TestReadOnlyNamespaceSaysSo(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	if _, err := e.st.CreateSnapshot(context.Background(), "vol0", "monday"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vol      string
		readOnly bool
	}{{"vol0", false}, {"vol0@monday", true}} {
		h := connectHost(t, e.addr, e.srv.NQN(c.vol), hostOpts{})
		b, st, err := h.identify(CNSNamespace, 1)
		if err != nil || st != StatusSuccess {
			t.Fatalf("%s: Identify Namespace: %v %v", c.vol, st, err)
		}
		if wp := IdentifyNamespace(b).NSATTR()&1 != 0; wp != c.readOnly {
			t.Errorf("%s: NSATTR write protected %v, want %v", c.vol, wp, c.readOnly)
		}
		want := StatusSuccess
		if c.readOnly {
			want = StatusNSWriteProtected | StatusDNR
		}
		if st, err := h.write(0, 0, make([]byte, store.BlockSize), false); err != nil || st != want {
			t.Errorf("%s: write: %v %v, want %v", c.vol, st, err, want)
		}
	}
}
