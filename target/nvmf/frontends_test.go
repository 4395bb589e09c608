package nvmf

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/initiator"
	"github.com/rnic-dev/rnic/store"
)

// TestReservationsBothWays: one lock table for both front ends. A native
// initiator's exclusive reservation makes NVMe writes (and trims, and
// write-zeroes) fail with Reservation Conflict while reads go on; an NVMe
// host's Write Exclusive reservation makes native writes fail with
// ErrReserved; each side's release (or end) frees the other.
func TestReservationsBothWays(t *testing.T) {
	e := newTestEnv(t, envOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	native, err := initiator.Connect(ctx, initiator.Config{Addr: e.addr, Volume: "vol0", Initiator: "native-host",
		Secret: e.secret, Logger: testLogger(), NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer native.Close()
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})
	block := make([]byte, store.BlockSize)
	rand.Read(block)

	// Native reserves: NVMe mutations are refused, reads are not.
	resv, err := native.Reserve(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := h.write(0, 10, block, false); err != nil || st != StatusReservationConf|StatusDNR {
		t.Fatalf("NVMe write under a native reservation: %v %v", st, err)
	}
	if st, err := h.write(0, 10, bytes.Repeat(block, 4), true); err != nil || st != StatusReservationConf|StatusDNR {
		t.Fatalf("NVMe keyed write under a native reservation: %v %v", st, err)
	}
	wz := rw(IOWriteZeroes, 10, 1)
	if r, _, err := h.io[0].do(wz, cmdOpts{}); err != nil || r.status() != StatusReservationConf|StatusDNR {
		t.Fatalf("NVMe Write Zeroes under a native reservation: %v %v", r.status(), err)
	}
	if r, _, err := h.io[0].do(dsm(true), dsmOpts(10, 1)); err != nil || r.status() != StatusReservationConf|StatusDNR {
		t.Fatalf("NVMe deallocate under a native reservation: %v %v", r.status(), err)
	}
	if _, st, err := h.read(0, 10, 1); err != nil || st != StatusSuccess {
		t.Fatalf("NVMe read under a native reservation: %v %v", st, err)
	}
	if err := native.WriteAt(ctx, block, 10*store.BlockSize, false); err != nil {
		t.Fatalf("the holder's own write: %v", err)
	}
	if got := e.srv.m.ReservationConflicts.Load(); got != 4 {
		t.Errorf("%d reservation conflicts counted, want 4", got)
	}
	if err := resv.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := h.write(0, 10, block, false); err != nil || st != StatusSuccess {
		t.Fatalf("NVMe write after the native release: %v %v", st, err)
	}

	// NVMe reserves: native writes are refused.
	key := uint64(0xfeedface)
	if st := h.resv(IOResvRegister, 0, 0, key); st != StatusSuccess {
		t.Fatalf("register: %v", st)
	}
	if st := h.resv(IOResvAcquire, 0|rtypeWriteExclusive<<8, key, 0); st != StatusSuccess {
		t.Fatalf("acquire: %v", st)
	}
	werr := native.WriteAt(ctx, block, 20*store.BlockSize, false)
	if !errors.Is(werr, initiator.ErrReserved) {
		t.Fatalf("native write under an NVMe reservation: %v", werr)
	}
	if _, err := native.Reserve(ctx, true); err == nil {
		t.Fatal("native reservation granted over an NVMe one")
	}
	excl, holders, err := native.ReservationHolders(ctx)
	if err != nil || !excl || len(holders) != 1 || holders[0] != h.hostNQN {
		t.Fatalf("native sees holders %v (exclusive %v), want [%s]: %v", holders, excl, h.hostNQN, err)
	}
	if st, err := h.write(0, 20, block, false); err != nil || st != StatusSuccess {
		t.Fatalf("the NVMe holder's write: %v %v", st, err)
	}
	// Report: Write Exclusive, this controller the holder.
	rep := h.resvReport()
	if rep[4] != rtypeWriteExclusive || binary.LittleEndian.Uint16(rep[5:]) != 1 || rep[24+2] != 1 ||
		binary.LittleEndian.Uint64(rep[24+16:]) != key {
		t.Fatalf("report % x", rep[:48])
	}
	// Wrong keys and types are refused.
	if st := h.resv(IOResvRelease, rtypeWriteExclusive<<8, key+1, 0); st != StatusReservationConf|StatusDNR {
		t.Fatalf("release with a wrong key: %v", st)
	}
	if st := h.resv(IOResvAcquire, 2<<8, key, 0); st != StatusInvalidField|StatusDNR {
		t.Fatalf("acquire of Exclusive Access: %v", st)
	}
	if st := h.resv(IOResvRelease, rtypeWriteExclusive<<8, key, 0); st != StatusSuccess {
		t.Fatalf("release: %v", st)
	}
	if err := native.WriteAt(ctx, block, 20*store.BlockSize, false); err != nil {
		t.Fatalf("native write after the NVMe release: %v", err)
	}

	// A reservation held by a controller that goes away is released.
	if st := h.resv(IOResvAcquire, rtypeWriteExclusive<<8, key, 0); st != StatusSuccess {
		t.Fatalf("acquire again: %v", st)
	}
	if err := h.disconnect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the NVMe controller to end", func() bool { return e.srv.m.Controllers.Load() == 0 })
	if err := native.WriteAt(ctx, block, 21*store.BlockSize, false); err != nil {
		t.Fatalf("native write after the NVMe holder left: %v", err)
	}
}

// resv sends a Register, Acquire or Release with the given CDW10 and keys
// (in-capsule, as Linux sends them) and returns the status.
func (h *testHost) resv(op uint8, cdw10 uint32, crkey, nkey uint64) Status {
	h.t.Helper()
	data := make([]byte, 16)
	binary.LittleEndian.PutUint64(data, crkey)
	binary.LittleEndian.PutUint64(data[8:], nkey)
	if op == IOResvRelease {
		data = data[:8]
	}
	f := CommandFields{Opcode: op, NSID: 1, CDW10_15: [6]uint32{cdw10}}
	r, _, err := h.io[0].do(f, cmdOpts{dir: dirFromHost, data: data, inCapsule: true})
	if err != nil {
		h.t.Fatal(err)
	}
	return r.status()
}

// resvReport returns the reservation status data (extended entries off).
func (h *testHost) resvReport() []byte {
	h.t.Helper()
	f := CommandFields{Opcode: IOResvReport, NSID: 1, CDW10_15: [6]uint32{4096/4 - 1}}
	r, b, err := h.io[0].do(f, cmdOpts{dir: dirToHost, data: make([]byte, 4096)})
	if err != nil || r.status() != StatusSuccess {
		h.t.Fatalf("report: %v %v", r.status(), err)
	}
	return b
}

// dsm is a Dataset Management command of one range (deallocate if ad).
func dsm(ad bool) CommandFields {
	f := CommandFields{Opcode: IODSM, NSID: 1}
	if ad {
		f.CDW10_15[1] = 1 << 2
	}
	return f
}

// dsmOpts is the 4096 bytes of ranges Linux sends, the first set.
func dsmOpts(slba uint64, nlb uint32) cmdOpts {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint32(b[4:], nlb)
	binary.LittleEndian.PutUint64(b[8:], slba)
	return cmdOpts{dir: dirFromHost, data: b, inCapsule: true}
}

// TestNativePartialWritesAndNVMeWrites: a native write of part of a block
// (read-modify-write at the target) and NVMe writes of the whole block,
// running at once, serialize: once an NVMe write has completed, the
// bytes the native writes do not cover hold that write's data. Without
// the NVMe side taking the block's stripe, a read-modify-write that read
// the block before the NVMe write wrote it back after, and the completed
// NVMe write was lost.
func TestNativePartialWritesAndNVMeWrites(t *testing.T) {
	// The thin store: its read and write of the block are system calls,
	// a window an NVMe write lands in.
	e := newTestEnv(t, envOpts{thin: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	native, err := initiator.Connect(ctx, initiator.Config{Addr: e.addr, Volume: "vol0", Initiator: "native-host",
		Secret: e.secret, Logger: testLogger(), NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer native.Close()
	h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{})

	const lba, lo, hi = 7, 512, 1024 // the native writes cover [lo, hi) of the block (sectors)
	const rounds = 2000
	stop := make(chan struct{})
	nativeErr := make(chan error, 1)
	go func() {
		part := make([]byte, hi-lo)
		for i := 0; ; i++ {
			select {
			case <-stop:
				nativeErr <- nil
				return
			default:
			}
			for j := range part {
				part[j] = byte(i)
			}
			if err := native.WriteAt(ctx, part, lba*store.BlockSize+lo, false); err != nil {
				nativeErr <- err
				return
			}
		}
	}()
	block := make([]byte, store.BlockSize)
	lost := 0
	for i := range rounds {
		binary.LittleEndian.PutUint64(block, uint64(i))
		for j := 8; j < len(block); j++ {
			block[j] = byte(i * 7)
		}
		if st, err := h.write(0, lba, block, false); err != nil || st != StatusSuccess {
			t.Fatalf("NVMe write %d: %v %v", i, st, err)
		}
		got, st, err := h.read(0, lba, 1)
		if err != nil || st != StatusSuccess {
			t.Fatalf("NVMe read %d: %v %v", i, st, err)
		}
		if !bytes.Equal(got[:lo], block[:lo]) || !bytes.Equal(got[hi:], block[hi:]) {
			lost++
		}
	}
	close(stop)
	if err := <-nativeErr; err != nil {
		t.Fatalf("native write: %v", err)
	}
	if lost > 0 {
		t.Fatalf("%d of %d completed NVMe writes were overwritten outside the native writes' range", lost, rounds)
	}
}
