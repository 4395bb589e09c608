package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
)

// The crash harness's blocks: every 4 KiB block written carries its block
// number, a per-block sequence number and a CRC32c, and the rest is
// generated from (block, seq), so any read decodes to exactly one write
// (or to zeros: never written) or is reported as torn.
const (
	crashBlock  = 4096
	crashBlocks = 2048 // the region written
	crashSpare  = 64   // blocks after it, never written: must read zeros
	crashMagic  = "RNICCRSH"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeBlock(b []byte, block, seq uint64) {
	copy(b[0:8], crashMagic)
	binary.LittleEndian.PutUint64(b[8:], block)
	binary.LittleEndian.PutUint64(b[16:], seq)
	r := rand.NewPCG(block, seq)
	for i := 24; i < crashBlock-8; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	binary.LittleEndian.PutUint32(b[crashBlock-8:], uint32(seq))
	binary.LittleEndian.PutUint32(b[crashBlock-4:], crc32.Checksum(b[:crashBlock-4], castagnoli))
}

// decodeBlock returns the sequence number block holds (0: all zeros).
func decodeBlock(b []byte, block uint64) (uint64, error) {
	if bytes.Count(b, []byte{0}) == len(b) {
		return 0, nil
	}
	if string(b[0:8]) != crashMagic {
		return 0, fmt.Errorf("no header (torn or garbage): % x", b[:24])
	}
	if got := binary.LittleEndian.Uint64(b[8:]); got != block {
		return 0, fmt.Errorf("holds block %d's data (misplaced write)", got)
	}
	seq := binary.LittleEndian.Uint64(b[16:])
	if sum := crc32.Checksum(b[:crashBlock-4], castagnoli); sum != binary.LittleEndian.Uint32(b[crashBlock-4:]) {
		return seq, fmt.Errorf("seq %d: checksum %08x != %08x (torn)", seq, sum, binary.LittleEndian.Uint32(b[crashBlock-4:]))
	}
	want := make([]byte, crashBlock)
	encodeBlock(want, block, seq)
	if !bytes.Equal(b, want) {
		return seq, fmt.Errorf("seq %d: checksum verifies but the content differs", seq)
	}
	return seq, nil
}

// crashModel is what the writers know: per block the sequence number last
// made durable and the highest one issued. A block may hold its durable
// value or any value issued after it (writes to a block are sequential:
// each block belongs to one writer).
type crashModel struct {
	mu      sync.Mutex
	durable [crashBlocks]uint64
	issued  [crashBlocks]uint64
	// pending are the non-FUA writes acknowledged since the last Flush
	// call: a Flush that succeeds makes them durable.
	pending []pendingWrite

	// flushMu orders flushes after writes the way the initiator's barrier
	// does: writers hold it shared from issue to recording, the flusher
	// exclusively, so pending is exactly what a Flush covers.
	flushMu sync.RWMutex

	// downs counts the crashes begun and ended: odd while rtarget is going
	// down or starting again.
	downs atomic.Uint64
	// powerCut: the crashes are power cuts (crashKind.powerCut). An
	// operation that overlaps one counts as unanswered (overlapsCut).
	powerCut bool

	acked, fua, failed                       atomic.Int64
	ackedAtCut                               atomic.Int64 // acknowledged, but overlapping a power cut
	flushOK, flushLost, flushCut, flushError atomic.Int64
}

type pendingWrite struct{ block, seq uint64 }

func (m *crashModel) write(ctx context.Context, c *initiator.Client, buf []byte, block uint64, fua bool) {
	m.flushMu.RLock()
	defer m.flushMu.RUnlock()
	m.mu.Lock()
	m.issued[block]++
	seq := m.issued[block]
	m.mu.Unlock()
	encodeBlock(buf, block, seq)
	d0 := m.downs.Load()
	if err := c.WriteAt(ctx, buf, int64(block)*crashBlock, fua); err != nil {
		// Not acknowledged: it may or may not have landed; either is
		// allowed (seq > durable), nothing becomes durable.
		m.failed.Add(1)
		return
	}
	m.acked.Add(1)
	if m.overlapsCut(d0) {
		m.ackedAtCut.Add(1) // as if not acknowledged
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if fua {
		m.fua.Add(1)
		m.durable[block] = max(m.durable[block], seq)
		return
	}
	m.pending = append(m.pending, pendingWrite{block, seq})
}

func (m *crashModel) flush(ctx context.Context, c *initiator.Client) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	_, err := m.flushLocked(ctx, c)
	return err
}

// flushLocked flushes with flushMu held exclusively; it reports whether
// every write acknowledged so far is durable now.
func (m *crashModel) flushLocked(ctx context.Context, c *initiator.Client) (bool, error) {
	d0 := m.downs.Load()
	m.mu.Lock()
	covered := m.pending
	m.pending = nil
	m.mu.Unlock()
	err := c.Flush(ctx)
	switch {
	case err == nil && m.overlapsCut(d0):
		m.flushCut.Add(1) // as if it had failed: nothing became durable
		return false, nil
	case err == nil:
		m.flushOK.Add(1)
		m.mu.Lock()
		for _, w := range covered {
			m.durable[w.block] = max(m.durable[w.block], w.seq)
		}
		m.mu.Unlock()
		return true, nil
	case errors.Is(err, initiator.ErrWritesLost):
		// By design after a crash: the writes since the last good flush
		// are not durable (they stay allowed, as values written after).
		m.flushLost.Add(1)
		return false, nil
	case m.overlapsCut(d0):
		m.flushCut.Add(1) // nothing became durable
		return false, nil
	default:
		m.flushError.Add(1)
		return false, fmt.Errorf("flush: %w", err)
	}
}

// overlapsCut reports whether an operation that began when downs was d0
// overlaps a power cut: the cut began while it ran, or it began while
// rtarget was down or coming up again. Its answer does not count, whatever
// it says: a write may or may not be durable, a flush makes nothing
// durable, a snapshot or clone may or may not exist. A real power cut
// stops the machine at once, so no answer given after it reaches anyone;
// the simulated one (loopfs.FS.PowerCut, FS_IOC_SHUTDOWN) leaves rtarget
// and the kernel running, and an fdatasync already in the kernel when the
// file system is shut down can return success after it although what it
// was to make durable is lost: on ext4, a block allocated in the journal
// transaction the shutdown aborts (jbd2 reports success for a transaction
// that is no longer running or committing, aborted or not). Answers given
// before the cut keep counting in full. With a kill (powerCut false)
// every answer counts: a killed rtarget answers nothing, and what it wrote
// before stays in the kernel's page cache.
func (m *crashModel) overlapsCut(d0 uint64) bool {
	return m.powerCut && (d0%2 == 1 || m.downs.Load() != d0)
}

// TestOverlapsCut checks which answers the model counts with power cuts:
// those of operations that ran while rtarget was up, between two cuts.
func TestOverlapsCut(t *testing.T) {
	for _, c := range []struct {
		powerCut bool
		d0, d1   uint64 // downs when the operation began and ended
		want     bool
	}{
		{true, 0, 0, false},  // before the first cut
		{true, 2, 2, false},  // after a restart
		{true, 0, 1, true},   // the cut began while it ran
		{true, 0, 2, true},   // ... and rtarget was back before it ended
		{true, 1, 1, true},   // began while rtarget was down
		{true, 1, 2, true},   // ... and was answered after the restart
		{false, 0, 1, false}, // a kill: every answer counts
		{false, 1, 2, false},
	} {
		m := &crashModel{powerCut: c.powerCut}
		m.downs.Store(c.d1)
		if got := m.overlapsCut(c.d0); got != c.want {
			t.Errorf("powerCut %v, downs %d then %d: overlapsCut %v, want %v", c.powerCut, c.d0, c.d1, got, c.want)
		}
	}
}

type verifyStats struct {
	blocks, zeros, atDurable, newer int
	problems                        []string
}

// verify reads every block of the region (and the spare blocks after it)
// and checks it against the model.
func (m *crashModel) verify(ctx context.Context, c *initiator.Client) (verifyStats, error) {
	var st verifyStats
	const chunk = 64 // blocks per read
	total := crashBlocks + crashSpare
	bufs := make([][]byte, 0, total/chunk)
	var wg sync.WaitGroup
	errs := make(chan error, total/chunk)
	sem := make(chan struct{}, 4)
	for first := 0; first < total; first += chunk {
		b := make([]byte, chunk*crashBlock)
		bufs = append(bufs, b)
		wg.Add(1)
		sem <- struct{}{}
		go func(first int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := c.ReadAt(ctx, b, int64(first)*crashBlock); err != nil {
				errs <- fmt.Errorf("read blocks %d-%d: %w", first, first+chunk-1, err)
			}
		}(first)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return st, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, b := range bufs {
		for j := 0; j < chunk; j++ {
			block := uint64(i*chunk + j)
			seq, err := decodeBlock(b[j*crashBlock:(j+1)*crashBlock], block)
			st.blocks++
			var durable, issued uint64
			if block < crashBlocks {
				durable, issued = m.durable[block], m.issued[block]
			}
			switch {
			case err != nil:
				st.problems = append(st.problems, fmt.Sprintf("block %d (durable %d, issued %d): %v", block, durable, issued, err))
			case seq < durable:
				st.problems = append(st.problems, fmt.Sprintf("block %d holds seq %d, older than its durable seq %d (issued %d)",
					block, seq, durable, issued))
			case seq > issued:
				st.problems = append(st.problems, fmt.Sprintf("block %d holds seq %d, never issued (issued %d)", block, seq, issued))
			case seq == 0:
				st.zeros++
			case seq == durable:
				st.atDurable++
			default:
				st.newer++
			}
		}
	}
	return st, nil
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

func envSeed(t *testing.T, name string) uint64 {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

func testLogger() *slog.Logger {
	if os.Getenv("RNIC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// TestCrashConsistency kills rtarget (the thin store) with SIGKILL at a random
// moment while writers write, FUA and flush through a library Client and
// snapshots, clones (written to with FUA) and snapshot deletions are made
// through the control socket, restarts it on the same data and address,
// lets the client reconnect and replay, and checks every block: never
// older than its durable value, never torn; every snapshot within its
// bounds when taken and unchanged ever after; every clone its snapshot
// plus its own durable writes. RNIC_CRASH_CYCLES sets the number of kills (default 3),
// RNIC_CRASH_SEED the seed.
//
// A kill leaves the page cache to the kernel, which writes it back: what
// rtarget wrote and did not sync survives. TestPowerLoss loses it.
func TestCrashConsistency(t *testing.T) {
	crashCycles(t, t.TempDir(), crashKind{what: "killed", down: func(t *testing.T, target *proc, _ string) {
		if err := target.stop(syscall.SIGKILL, 10*time.Second); err == nil {
			t.Fatalf("rtarget exited cleanly before the kill:\n%s", target.output())
		}
	}})
}

// crashKind is how a crash test brings rtarget down.
type crashKind struct {
	what string // for the log: "killed"
	// down brings the running target down for good; healthz is its
	// /healthz URL.
	down func(t *testing.T, target *proc, healthz string)
	// powerCut: down cuts the power. An operation that overlaps it counts
	// as unanswered (crashModel.overlapsCut), and a flush that overlaps
	// it may fail (the dying target's fdatasync fails with EIO). Otherwise
	// a flush fails only with ErrWritesLost.
	powerCut bool
	// raw serves a raw volume (a 64 MiB file beside data) in place of a
	// thin one, and takes no snapshots (a raw volume has none).
	raw bool
}

// crashCycles runs the workload of TestCrashConsistency against rtarget
// serving a thin store in data, bringing it down with kind.down
// RNIC_CRASH_CYCLES times.
func crashCycles(t *testing.T, data string, kind crashKind) {
	cycles := envInt(t, "RNIC_CRASH_CYCLES", 3)
	seed := envSeed(t, "RNIC_CRASH_SEED")
	t.Logf("RNIC_CRASH_SEED=%d cycles=%d", seed, cycles)
	rng := rand.New(rand.NewPCG(seed, 0xc4a54))
	rt, _ := bins(t)
	addr, metrics := freePort(t), freePort(t)
	args := []string{"serve", "--data", data, "--listen", addr, "--metrics-listen", metrics, "--volume", "vol:64M"}
	if kind.raw {
		img := filepath.Join(filepath.Dir(data), "raw.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 64<<20); err != nil {
			t.Fatal(err)
		}
		run(t, time.Minute, rt, "volume", "create", "--data", data, "--raw", img, "vol")
		args = args[:len(args)-2]
	}
	target := start(t, rt, args...)
	waitPort(t, addr, target)

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cycles)*time.Minute+time.Minute)
	defer cancel()
	c, err := initiator.Connect(ctx, initiator.Config{Addr: addr, Volume: "vol", Initiator: "crash",
		Secret: []byte(clix.InsecureSecret), Logger: testLogger(),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close()

	m := &crashModel{powerCut: kind.powerCut}
	sn := newCrashSnaps(t, filepath.Join(data, "rtarget.sock"), addr, "vol")
	defer sn.close()
	const writers = 8
	began := time.Now()
	var totalBlocks int
	for cycle := 1; cycle <= cycles; cycle++ {
		ackedBefore := m.acked.Load()
		killAfter := time.Duration(150+rng.IntN(1350)) * time.Millisecond
		runAfter := time.Duration(rng.IntN(300)) * time.Millisecond
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wseed := rng.Uint64()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(wseed, uint64(w)))
				buf := make([]byte, crashBlock)
				for {
					select {
					case <-stop:
						return
					default:
					}
					block := uint64(r.IntN(crashBlocks/writers)*writers + w)
					m.write(ctx, c, buf, block, r.IntN(8) == 0)
				}
			}()
		}
		snapSeed := rng.Uint64()
		snapDone := make(chan struct{})
		go func() {
			defer close(snapDone)
			if kind.raw {
				<-stop
				return
			}
			sn.run(ctx, m, c, stop, rand.New(rand.NewPCG(snapSeed, 2)))
		}()
		flushSeed := rng.Uint64()
		flushErr := make(chan error, 1)
		go func() {
			r := rand.New(rand.NewPCG(flushSeed, 1))
			for {
				select {
				case <-stop:
					flushErr <- nil
					return
				case <-time.After(time.Duration(5+r.IntN(45)) * time.Millisecond):
				}
				if err := m.flush(ctx, c); err != nil {
					flushErr <- err
					return
				}
			}
		}()

		time.Sleep(killAfter)
		ackedAtKill := m.acked.Load() - ackedBefore
		m.downs.Add(1)
		kind.down(t, target, "http://"+metrics+"/healthz")
		target = start(t, rt, args...)
		waitPort(t, addr, target)
		m.downs.Add(1)
		time.Sleep(runAfter) // writes and flushes go on against the new target
		close(stop)
		wg.Wait()
		<-snapDone
		if err := <-flushErr; err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}

		st, err := m.verify(ctx, c)
		if err != nil {
			t.Fatalf("cycle %d: verify: %v", cycle, err)
		}
		totalBlocks += st.blocks
		t.Logf("cycle %d: %s after %s (%d writes acknowledged by then), ran %s after the restart; "+
			"%d writes acknowledged this cycle; %d blocks verified: %d at their durable value, %d newer, %d zeros",
			cycle, kind.what, killAfter, ackedAtKill, runAfter, m.acked.Load()-ackedBefore, st.blocks, st.atDurable, st.newer, st.zeros)
		if len(st.problems) > 0 {
			for i, p := range st.problems {
				if i == 20 {
					t.Errorf("... and %d more", len(st.problems)-i)
					break
				}
				t.Error(p)
			}
			t.Fatalf("cycle %d: %d blocks violate crash consistency (RNIC_CRASH_SEED=%d)", cycle, len(st.problems), seed)
		}
		if problems := sn.verify(ctx); len(problems) > 0 {
			for i, p := range problems {
				if i == 20 {
					t.Errorf("... and %d more", len(problems)-i)
					break
				}
				t.Error(p)
			}
			t.Fatalf("cycle %d: snapshots or clones violate crash consistency (RNIC_CRASH_SEED=%d)", cycle, seed)
		}
		if !kind.raw {
			t.Logf("cycle %d: %s", cycle, sn.summary())
		}
	}
	checkTheChecker(ctx, t, m, c)
	t.Logf("%d cycles survived in %s: %d blocks verified; writes %d acknowledged (%d FUA, %d overlapping a power cut), %d failed; "+
		"flushes %d ok, %d reported writes lost, %d failed as rtarget went down or overlapped a power cut, %d failed",
		cycles, time.Since(began).Round(time.Millisecond), totalBlocks, m.acked.Load(), m.fua.Load(), m.ackedAtCut.Load(), m.failed.Load(),
		m.flushOK.Load(), m.flushLost.Load(), m.flushCut.Load(), m.flushError.Load())
}

// checkTheChecker plants a stale value, a torn block and a stray write and
// makes sure verify reports each of them.
func checkTheChecker(ctx context.Context, t *testing.T, m *crashModel, c *initiator.Client) {
	t.Helper()
	m.mu.Lock()
	stale := -1
	for b := range m.durable {
		if m.durable[b] > 1 {
			stale = b
			break
		}
	}
	var staleSeq uint64
	if stale >= 0 {
		staleSeq = m.durable[stale] - 1
	}
	m.mu.Unlock()
	buf := make([]byte, crashBlock)
	want := 2
	if stale >= 0 {
		encodeBlock(buf, uint64(stale), staleSeq)
		if err := c.WriteAt(ctx, buf, int64(stale)*crashBlock, false); err != nil {
			t.Fatalf("plant a stale block: %v", err)
		}
		want++
	}
	torn := uint64(crashBlocks - 1)
	encodeBlock(buf, torn, 1)
	buf[100] ^= 1
	if err := c.WriteAt(ctx, buf, int64(torn)*crashBlock, false); err != nil {
		t.Fatalf("plant a torn block: %v", err)
	}
	encodeBlock(buf, 5, 1)
	if err := c.WriteAt(ctx, buf, crashBlocks*crashBlock, false); err != nil { // a spare block
		t.Fatalf("plant a misplaced block: %v", err)
	}
	st, err := m.verify(ctx, c)
	if err != nil {
		t.Fatalf("verify the planted blocks: %v", err)
	}
	if len(st.problems) != want {
		t.Fatalf("the checker found %d of %d planted faults: %q", len(st.problems), want, st.problems)
	}
	t.Logf("the checker reports planted faults: %q", st.problems)
}
