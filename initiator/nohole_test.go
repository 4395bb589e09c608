package initiator_test

import (
	"bytes"
	"testing"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/internal/rawpeer"
	"github.com/rnic-dev/rnic/target"
)

// TestWriteZeroesAllocated: Client.WriteZeroesAllocated leaves ranges
// reading as zeros and allocated (BlockStatus: data), over data and over
// blocks never written, unaligned and larger than the maximum transfer,
// with and without FUA, on the memory and thin stores. A target that
// honours FlagNoHole gets WRITE_ZEROES (and no WRITE); one that predates
// it (it refuses the LOGIN asking for it) is logged in to without it and
// gets the zeros as WRITEs.
func TestWriteZeroesAllocated(t *testing.T) {
	for _, c := range []struct {
		name         string
		thin, legacy bool
	}{{"memory", false, false}, {"thin", true, false}, {"thin legacy target", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			m := new(target.Metrics)
			e := newEnv(t, envOpts{thin: c.thin, size: 32 << 20, tcfg: func(cfg *target.Config) {
				cfg.LegacyNoHole, cfg.Metrics = c.legacy, m
			}})
			cl := e.client("nohole", nil)
			ctx := tctx(t)
			data := bytes.Repeat([]byte{0x3c}, 1<<20)
			if err := cl.WriteAt(ctx, data, 0, false); err != nil {
				t.Fatal(err)
			}
			writes, zeroes := m.Ops[target.OpWrite].Load(), m.Ops[target.OpWriteZeroes].Load()
			ranges := []struct {
				off, n int64
				fua    bool
			}{
				{512, 256<<10 - 1024, true}, // over data, unaligned to blocks
				{8 << 20, 3 << 20, false},   // never written, three maximum transfers
			}
			for _, r := range ranges {
				if err := cl.WriteZeroesAllocated(ctx, r.off, r.n, r.fua); err != nil {
					t.Fatalf("WriteZeroesAllocated(%d, %d): %v", r.off, r.n, err)
				}
				got := make([]byte, r.n)
				if err := cl.ReadAt(ctx, got, r.off); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, make([]byte, r.n)) {
					t.Fatalf("%d bytes at %d do not read as zeros", r.n, r.off)
				}
				if rs := runs(t, cl.BlockStatus, r.off, r.n); len(rs) != 1 || rs[0].hole {
					t.Fatalf("BlockStatus(%d, %d) after WriteZeroesAllocated: %+v, want data", r.off, r.n, rs)
				}
			}
			dw, dz := m.Ops[target.OpWrite].Load()-writes, m.Ops[target.OpWriteZeroes].Load()-zeroes
			if c.legacy {
				if dz != 0 || dw < 4 {
					t.Fatalf("a target without FlagNoHole: %d WRITE_ZEROES, %d WRITEs; want none and the zeros written", dz, dw)
				}
			} else if dz != 2 || dw != 0 {
				t.Fatalf("a target with FlagNoHole: %d WRITE_ZEROES, %d WRITEs; want 2 and none", dz, dw)
			}
			// Plain zeroing still frees the space.
			if err := cl.WriteZeroes(ctx, 8<<20, 1<<20, false); err != nil {
				t.Fatal(err)
			}
			if rs := runs(t, cl.BlockStatus, 8<<20, 1<<20); len(rs) != 1 || !rs[0].hole {
				t.Fatalf("BlockStatus after WriteZeroes: %+v, want a hole", rs)
			}
		})
	}
}

// TestNoHoleOnlyWhereGranted: the target gives FlagNoHole only to a LOGIN
// that asks for it (an initiator that predates it refuses a WELCOME with
// the flag), and answers a WRITE_ZEROES with FlagNoHole on such a QP with
// StatusInvalid, changing nothing; the session goes on.
func TestNoHoleOnlyWhereGranted(t *testing.T) {
	e := newEnv(t, envOpts{})
	s, err := rawDial(e.addr, rawpeer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.doLogin("old-initiator", testSecret, 4); err != nil {
		t.Fatal(err)
	}
	if s.welcome.Fields().NoHole {
		t.Fatal("WELCOME with FlagNoHole to a LOGIN without it")
	}
	if err := s.write(0, bytes.Repeat([]byte{9}, 4096)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flags uint16
		want  blockproto.Status
	}{{blockproto.FlagNoHole, blockproto.StatusInvalid}, {0, blockproto.StatusOK}} {
		tag, err := s.command(blockproto.CommandFields{Op: blockproto.OpWriteZeroes, Flags: c.flags, Length: 4096}, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.response(tag)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status() != c.want {
			t.Fatalf("WRITE_ZEROES with flags %#x: %s, want %s", c.flags, r.Status(), c.want)
		}
		got, err := s.read(0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if zero := bytes.Equal(got, make([]byte, 4096)); zero != (c.want == blockproto.StatusOK) {
			t.Fatalf("after WRITE_ZEROES with flags %#x (%s) the block reads as zeros: %v", c.flags, r.Status(), zero)
		}
	}
}
