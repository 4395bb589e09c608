package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/initiator"
)

// The snapshots and clones of TestCrashConsistency.

// cloneSeqBase marks the blocks a clone's own writes carry: their sequence
// numbers start there, above anything the volume's writers issue.
const cloneSeqBase = 1 << 40

// crashSnap is a snapshot the test took: what each block may hold (from
// what was durable when it was taken to what had been issued), and what it
// held when first read, which it must hold ever after.
type crashSnap struct {
	name   string
	lo, hi [crashBlocks]uint64
	seqs   []uint64 // nil until read
}

// crashClone is a clone of a snapshot and the FUA writes made to it.
type crashClone struct {
	name    string
	base    *crashSnap
	c       *initiator.Client
	mu      sync.Mutex
	durable map[uint64]uint64 // block -> seq
	issued  map[uint64]uint64
	next    uint64
}

type crashSnaps struct {
	t          *testing.T
	sock, addr string
	vol        string

	mu     sync.Mutex
	n      int
	snaps  []*crashSnap
	clones []*crashClone
	// What commands that failed or overlapped a power cut
	// (crashModel.overlapsCut) may have left:
	maybe  []*crashSnap // snapshots made that may exist
	doomed []*crashSnap // snapshots deleted that may be there still
	maybeC []string     // clones made or deleted that may exist
	stats  struct{ snaps, clones, deleted, failed int }
}

func newCrashSnaps(t *testing.T, sock, addr, vol string) *crashSnaps {
	return &crashSnaps{t: t, sock: sock, addr: addr, vol: vol}
}

func (s *crashSnaps) close() {
	for _, cl := range s.clones {
		cl.c.Close()
	}
}

// ctl sends one request to rtarget serve's control socket (never opening
// the store itself: the target may be down, and will come back on it).
func (s *crashSnaps) ctl(req map[string]any) (map[string]any, error) {
	c, err := net.DialTimeout("unix", s.sock, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req["v"] = 1
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var resp map[string]any
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, err
	}
	if e, ok := resp["error"].(string); ok {
		return resp, errors.New(e)
	}
	return resp, nil
}

// run takes snapshots, clones and deletes until stop, and writes to the
// clones.
func (s *crashSnaps) run(ctx context.Context, m *crashModel, c *initiator.Client, stop chan struct{}, rng *rand.Rand) {
	var wg sync.WaitGroup
	defer wg.Wait()
	s.mu.Lock()
	for _, cl := range s.clones {
		wg.Add(1)
		seed := rng.Uint64() // drawn here: rng belongs to this goroutine
		go func() { defer wg.Done(); cl.write(ctx, m, stop, seed) }()
	}
	s.mu.Unlock()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(50+rng.IntN(200)) * time.Millisecond):
		}
		s.mu.Lock()
		many := len(s.snaps) > 4
		s.mu.Unlock()
		switch r := rng.IntN(10); {
		case r < 5 && !many:
			s.snapshot(ctx, m, c)
		case r < 7:
			if cl := s.clone(ctx, m, rng); cl != nil {
				wg.Add(1)
				seed := rng.Uint64()
				go func() { defer wg.Done(); cl.write(ctx, m, stop, seed) }()
			}
		default:
			s.deleteOne(m, rng)
		}
	}
}

// snapshot takes one with no write of the volume in flight, right after a
// flush that made every acknowledged write durable.
func (s *crashSnaps) snapshot(ctx context.Context, m *crashModel, c *initiator.Client) {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	if ok, err := m.flushLocked(ctx, c); !ok || err != nil {
		return
	}
	s.mu.Lock()
	s.n++
	sn := &crashSnap{name: fmt.Sprintf("s%d", s.n)}
	s.mu.Unlock()
	m.mu.Lock()
	sn.lo, sn.hi = m.durable, m.issued
	m.mu.Unlock()
	d0 := m.downs.Load()
	_, err := s.ctl(map[string]any{"op": "snapshot", "name": s.vol, "snap": sn.name})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || m.overlapsCut(d0) {
		s.stats.failed++
		s.maybe = append(s.maybe, sn)
		return
	}
	s.stats.snaps++
	s.snaps = append(s.snaps, sn)
}

// clone makes a clone of a snapshot already read (so its content is
// known), at most 2 at a time.
func (s *crashSnaps) clone(ctx context.Context, m *crashModel, rng *rand.Rand) *crashClone {
	s.mu.Lock()
	var read []*crashSnap
	for _, sn := range s.snaps {
		if sn.seqs != nil {
			read = append(read, sn)
		}
	}
	if len(read) == 0 || len(s.clones) >= 2 {
		s.mu.Unlock()
		return nil
	}
	s.n++
	cl := &crashClone{name: fmt.Sprintf("c%d", s.n), base: read[rng.IntN(len(read))],
		durable: map[uint64]uint64{}, issued: map[uint64]uint64{}, next: cloneSeqBase}
	s.mu.Unlock()
	d0 := m.downs.Load()
	_, err := s.ctl(map[string]any{"op": "clone", "name": s.vol, "snap": cl.base.name, "new_name": cl.name})
	if err != nil || m.overlapsCut(d0) {
		s.mu.Lock()
		s.stats.failed++
		s.maybeC = append(s.maybeC, cl.name)
		s.mu.Unlock()
		return nil
	}
	cl.c, err = initiator.Connect(ctx, initiator.Config{Addr: s.addr, Volume: cl.name, Initiator: "crash-" + cl.name,
		Secret: []byte(clix.InsecureSecret), Logger: testLogger(),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		// The target went down meanwhile: the clone exists, without writes.
		s.mu.Lock()
		s.maybeC = append(s.maybeC, cl.name)
		s.mu.Unlock()
		return nil
	}
	s.mu.Lock()
	s.stats.clones++
	s.clones = append(s.clones, cl)
	s.mu.Unlock()
	return cl
}

// write writes FUA blocks to the clone until stop; a write that overlaps
// a power cut counts as unanswered (crashModel.overlapsCut).
func (cl *crashClone) write(ctx context.Context, m *crashModel, stop chan struct{}, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 3))
	buf := make([]byte, crashBlock)
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(rng.IntN(20)) * time.Millisecond):
		}
		block := uint64(rng.IntN(crashBlocks))
		cl.mu.Lock()
		cl.next++
		seq := cl.next
		cl.issued[block] = seq
		cl.mu.Unlock()
		encodeBlock(buf, block, seq)
		d0 := m.downs.Load()
		if err := cl.c.WriteAt(ctx, buf, int64(block)*crashBlock, true); err != nil || m.overlapsCut(d0) {
			continue
		}
		cl.mu.Lock()
		cl.durable[block] = seq
		cl.mu.Unlock()
	}
}

// deleteOne deletes the oldest clone when there are two, else the oldest
// snapshot without clones when there are more than three.
func (s *crashSnaps) deleteOne(m *crashModel, rng *rand.Rand) {
	s.mu.Lock()
	if len(s.clones) == 2 && rng.IntN(2) == 0 {
		cl := s.clones[0]
		s.clones = s.clones[1:]
		s.mu.Unlock()
		cl.c.Close()
		d0 := m.downs.Load()
		if _, err := s.ctl(map[string]any{"op": "delete", "name": cl.name}); err != nil || m.overlapsCut(d0) {
			s.mu.Lock()
			s.stats.failed++
			s.maybeC = append(s.maybeC, cl.name)
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		s.stats.deleted++
		s.mu.Unlock()
		return
	}
	var victim *crashSnap
	if len(s.snaps) > 3 {
		for _, sn := range s.snaps {
			if !slices.ContainsFunc(s.clones, func(cl *crashClone) bool { return cl.base == sn }) {
				victim = sn
				break
			}
		}
	}
	s.mu.Unlock()
	if victim == nil {
		return
	}
	d0 := m.downs.Load()
	_, err := s.ctl(map[string]any{"op": "delete-snapshot", "name": s.vol, "snap": victim.name})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps = slices.DeleteFunc(s.snaps, func(sn *crashSnap) bool { return sn == victim })
	if err == nil && !m.overlapsCut(d0) {
		s.stats.deleted++
	} else {
		s.stats.failed++
		s.doomed = append(s.doomed, victim)
	}
}

// verify settles what failed commands left (after a restart: whatever
// exists is checked as if the command had succeeded; leftover clones are
// deleted), then reads every snapshot and clone.
func (s *crashSnaps) verify(ctx context.Context) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp, err := s.ctl(map[string]any{"op": "stat", "name": s.vol})
	if err != nil {
		return []string{fmt.Sprintf("stat %s: %v", s.vol, err)}
	}
	exists := map[string]bool{}
	vol, _ := resp["volume"].(map[string]any)
	snaps, _ := vol["Snapshots"].([]any)
	for _, x := range snaps {
		if m, ok := x.(map[string]any); ok {
			exists[m["Name"].(string)] = true
		}
	}
	for _, sn := range append(s.maybe, s.doomed...) {
		if exists[sn.name] {
			s.snaps = append(s.snaps, sn)
		}
	}
	s.maybe, s.doomed = nil, nil
	var problems []string
	for _, sn := range s.snaps {
		if !exists[sn.name] {
			problems = append(problems, fmt.Sprintf("snapshot %s is gone", sn.name))
		}
	}
	for _, name := range s.maybeC {
		if _, err := s.ctl(map[string]any{"op": "delete", "name": name}); err != nil && !errorsContain(err, "not found") {
			problems = append(problems, fmt.Sprintf("delete leftover clone %s: %v", name, err))
		}
	}
	s.maybeC = nil
	for _, sn := range s.snaps {
		problems = append(problems, s.verifySnap(ctx, sn)...)
	}
	for _, cl := range s.clones {
		problems = append(problems, cl.verify(ctx)...)
	}
	return problems
}

func errorsContain(err error, s string) bool {
	return err != nil && len(err.Error()) > 0 && contains(err.Error(), s)
}

func contains(a, b string) bool {
	for i := 0; i+len(b) <= len(a); i++ {
		if a[i:i+len(b)] == b {
			return true
		}
	}
	return false
}

// readAll reads the test region through c.
func readRegion(ctx context.Context, c *initiator.Client) ([]byte, error) {
	buf := make([]byte, crashBlocks*crashBlock)
	for off := 0; off < len(buf); off += 1 << 20 {
		if err := c.ReadAt(ctx, buf[off:off+1<<20], int64(off)); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

func (s *crashSnaps) verifySnap(ctx context.Context, sn *crashSnap) []string {
	ref := s.vol + "@" + sn.name
	c, err := initiator.Connect(ctx, initiator.Config{Addr: s.addr, Volume: ref, Initiator: "crash-check",
		Secret: []byte(clix.InsecureSecret), Logger: testLogger()})
	if err != nil {
		return []string{fmt.Sprintf("connect to %s: %v", ref, err)}
	}
	buf, err := readRegion(ctx, c)
	c.Close()
	if err != nil {
		return []string{fmt.Sprintf("read %s: %v", ref, err)}
	}
	var problems []string
	first := sn.seqs == nil
	if first {
		sn.seqs = make([]uint64, crashBlocks)
	}
	for b := range uint64(crashBlocks) {
		seq, err := decodeBlock(buf[b*crashBlock:(b+1)*crashBlock], b)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s block %d: %v", ref, b, err))
		case first && (seq < sn.lo[b] || seq > sn.hi[b]):
			problems = append(problems, fmt.Sprintf("%s block %d holds seq %d, want %d..%d", ref, b, seq, sn.lo[b], sn.hi[b]))
		case first:
			sn.seqs[b] = seq
		case seq != sn.seqs[b]:
			problems = append(problems, fmt.Sprintf("%s block %d changed: seq %d, first read %d", ref, b, seq, sn.seqs[b]))
		}
	}
	return problems
}

func (cl *crashClone) verify(ctx context.Context) []string {
	buf, err := readRegion(ctx, cl.c)
	if err != nil {
		return []string{fmt.Sprintf("read clone %s: %v", cl.name, err)}
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var problems []string
	for b := range uint64(crashBlocks) {
		seq, err := decodeBlock(buf[b*crashBlock:(b+1)*crashBlock], b)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("clone %s block %d: %v", cl.name, b, err))
		case seq >= cloneSeqBase && (seq < cl.durable[b] || seq > cl.issued[b]):
			problems = append(problems, fmt.Sprintf("clone %s block %d holds seq %d, want %d..%d", cl.name, b, seq, cl.durable[b], cl.issued[b]))
		case seq < cloneSeqBase && (cl.durable[b] != 0 || seq != cl.base.seqs[b]):
			problems = append(problems, fmt.Sprintf("clone %s block %d holds seq %d of the volume, want its own %d or the snapshot's %d",
				cl.name, b, seq, cl.durable[b], cl.base.seqs[b]))
		}
	}
	return problems
}

func (s *crashSnaps) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d snapshots and %d clones live (%d snapshots, %d clones made, %d deleted, %d commands cut by the crashes so far)",
		len(s.snaps), len(s.clones), s.stats.snaps, s.stats.clones, s.stats.deleted, s.stats.failed)
}
