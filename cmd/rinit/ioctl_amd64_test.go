package main

import (
	"testing"

	"github.com/pojntfx/go-nbd/pkg/ioctl"
)

// TestNBDIoctlNumbers checks the NBD ioctl numbers rinit spells out against
// go-nbd's, which come from linux/nbd.h through cgo where a C compiler is
// present (its amd64 table otherwise).
func TestNBDIoctlNumbers(t *testing.T) {
	for _, c := range []struct {
		name      string
		ours, ref uintptr
	}{
		{"NBD_SET_SOCK", nbdSetSock, ioctl.NEGOTIATION_IOCTL_SET_SOCK},
		{"NBD_SET_BLKSIZE", nbdSetBlockSize, ioctl.NEGOTIATION_IOCTL_SET_BLOCKSIZE},
		{"NBD_SET_SIZE_BLOCKS", nbdSetSizeBlocks, ioctl.NEGOTIATION_IOCTL_SET_SIZE_BLOCKS},
		{"NBD_DO_IT", nbdDoIt, ioctl.NEGOTIATION_IOCTL_DO_IT},
		{"NBD_CLEAR_SOCK", nbdClearSock, ioctl.TRANSMISSION_IOCTL_CLEAR_SOCK},
		{"NBD_CLEAR_QUE", nbdClearQueue, ioctl.TRANSMISSION_IOCTL_CLEAR_QUE},
		{"NBD_DISCONNECT", nbdDisconnect, ioctl.TRANSMISSION_IOCTL_DISCONNECT},
	} {
		if c.ours != c.ref {
			t.Errorf("%s: rinit uses %#x, linux/nbd.h says %#x", c.name, c.ours, c.ref)
		}
	}
	// NBD_SET_FLAGS is _IO(0xab, 10); go-nbd does not name it.
	if nbdSetFlags != 0xab0a {
		t.Errorf("NBD_SET_FLAGS: %#x, want 0xab0a", nbdSetFlags)
	}
}
