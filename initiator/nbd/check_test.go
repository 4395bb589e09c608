package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
)

func TestCheck(t *testing.T) {
	rw := Export{Backend: newMem(0)}.withDefaults()
	ro := Export{Backend: newMem(0), ReadOnly: true}.withDefaults()
	const size = 1 << 20
	bs := Export{Backend: newMem(0)}.withDefaults()
	bs.MaxBlock = 64 << 10
	for _, tc := range []struct {
		exp   Export
		typ   uint16
		flags uint16
		off   uint64
		n     uint32
		want  uint32
	}{
		{rw, CmdRead, 0, 0, 512, 0},
		{rw, CmdRead, 0, size - 512, 512, 0},
		{rw, CmdRead, 0, size, 0, 0},
		{rw, CmdRead, 0, size, 512, EINVAL},
		{rw, CmdRead, 0, 1<<64 - 512, 512, EINVAL},
		{rw, CmdWrite, 0, size, 512, ENOSPC},
		{rw, CmdWrite, 0, 1<<64 - 512, 1024, ENOSPC},
		{rw, CmdWriteZeroes, CmdFlagNoHole | CmdFlagFUA, size - 512, 1024, ENOSPC},
		{rw, CmdTrim, 0, size - 512, 1024, EINVAL},
		{rw, CmdCache, 0, size - 512, 1024, EINVAL},
		{rw, CmdWrite, 0, 1, 512, EINVAL},
		{rw, CmdWrite, 0, 0, 513, EINVAL},
		{rw, CmdTrim, 0, 0, 32<<20 + 512, EINVAL}, // past the end, not oversize
		{rw, CmdRead, 0, 0, 32<<20 + 512, EINVAL},
		{rw, CmdFlush, CmdFlagFUA, 0, 0, 0},
		{rw, CmdFlush, 0, 0, 512, EINVAL},
		{rw, CmdWrite, CmdFlagNoHole, 0, 512, EINVAL},
		{rw, CmdRead, CmdFlagReqOne, 0, 512, EINVAL},
		{rw, CmdDisc, 0, 0, 0, EINVAL}, // never checked: the reader handles DISC
		{rw, CmdBlockStatus, 0, 0, 512, EINVAL},
		{rw, 0xffff, 0, 0, 512, EINVAL},
		{ro, CmdWrite, 0, 0, 512, EPERM},
		{ro, CmdTrim, 0, 0, 512, EPERM},
		{ro, CmdWriteZeroes, 0, 0, 512, EPERM},
		{ro, CmdRead, 0, 0, 512, 0},
		{ro, CmdFlush, 0, 0, 0, 0},
		// bs has base:allocation selected.
		{bs, CmdBlockStatus, 0, 0, 512, 0},
		{bs, CmdBlockStatus, CmdFlagReqOne | CmdFlagFUA, 0, size, 0}, // longer than MaxBlock: no payload
		{bs, CmdBlockStatus, 0, 0, 0, EINVAL},
		{bs, CmdBlockStatus, 0, size - 512, 1024, EINVAL},
		{bs, CmdBlockStatus, 0, 1, 512, EINVAL},
		{bs, CmdBlockStatus, CmdFlagNoHole, 0, 512, EINVAL},
	} {
		r := &request{typ: tc.typ, flags: tc.flags, off: tc.off, length: tc.n}
		sel := selected{exp: tc.exp, size: size, structured: tc.exp.MaxBlock == 64<<10, metaAlloc: tc.exp.MaxBlock == 64<<10}
		if got := check(sel, r); got != tc.want {
			t.Errorf("%s ro=%v flags %#x off %d len %d: %d, want %d", commandName(tc.typ), tc.exp.ReadOnly, tc.flags, tc.off, tc.n, got, tc.want)
		}
	}
}

func TestErrno(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want uint32
	}{
		{nil, 0},
		{errors.New("x"), EIO},
		{io.ErrUnexpectedEOF, EIO},
		{&Error{Errno: ENOSPC}, ENOSPC},
		{fmt.Errorf("wrapped: %w", &Error{Errno: EOVERFLOW, Err: syscall.EIO}), EOVERFLOW},
		{&Error{Errno: 2}, EIO}, // ENOENT is not an NBD error value
		{context.Canceled, ESHUTDOWN},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), ESHUTDOWN},
		{syscall.EPERM, EPERM},
		{syscall.EROFS, EPERM},
		{syscall.ENOSPC, ENOSPC},
		{syscall.EDQUOT, ENOSPC},
		{syscall.EFBIG, ENOSPC},
		{syscall.EINVAL, EINVAL},
		{syscall.ENOMEM, ENOMEM},
		{syscall.EOVERFLOW, EOVERFLOW},
		{syscall.EOPNOTSUPP, ENOTSUP},
		{errors.ErrUnsupported, ENOTSUP},
		{syscall.ESHUTDOWN, ESHUTDOWN},
		{syscall.EIO, EIO},
	} {
		if got := Errno(tc.err); got != tc.want {
			t.Errorf("Errno(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	be := newMem(4096)
	for _, tc := range []struct {
		name string
		srv  Server
	}{
		{"no exports", Server{}},
		{"nil backend", Server{Exports: []Export{{Name: "a"}}}},
		{"duplicate", Server{Exports: []Export{{Name: "a", Backend: be}, {Name: "a", Backend: be}}}},
		{"min not power of two", Server{Exports: []Export{{Backend: be, MinBlock: 768}}}},
		{"min too large", Server{Exports: []Export{{Backend: be, MinBlock: 128 << 10, PrefBlock: 128 << 10}}}},
		{"pref below 512", Server{Exports: []Export{{Backend: be, MinBlock: 1, PrefBlock: 256}}}},
		{"max below pref", Server{Exports: []Export{{Backend: be, MaxBlock: 1024}}}},
	} {
		if _, err := tc.srv.config(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tc.name, err)
		}
	}
	cfg, err := (&Server{Exports: []Export{{Backend: be, MinBlock: 1}}, MaxInFlightBytes: 1}).config()
	if err != nil {
		t.Fatal(err)
	}
	if e := cfg.exports[0]; e.MinBlock != 1 || e.PrefBlock != 4096 || e.MaxBlock != 32<<20 {
		t.Errorf("defaults: %d/%d/%d", e.MinBlock, e.PrefBlock, e.MaxBlock)
	}
	if cfg.maxInFlightBytes != 32<<20 {
		t.Errorf("payload budget %d not raised to the maximum payload", cfg.maxInFlightBytes)
	}
}

func TestPoolClasses(t *testing.T) {
	var p bufPool
	for _, n := range []int{0, 1, 4096, 4097, 65536, 1 << 20, 32 << 20, 32<<20 + 1} {
		b := p.get(n)
		if len(*b) != n {
			t.Fatalf("get(%d): len %d", n, len(*b))
		}
		p.put(b)
	}
	if c := class(32<<20 + 1); c != -1 {
		t.Errorf("class(32MiB+1) = %d", c)
	}
	if c := class(8192); c != 1 {
		t.Errorf("class(8192) = %d", c)
	}
}
