//go:build mips || mipsle || mips64 || mips64le || ppc || ppc64 || ppc64le || sparc || sparc64

package main

// ioIONone is _IOC(_IOC_NONE, 0, 0, 0) on the architectures whose
// asm/ioctl.h sets _IOC_NONE to 1 and its direction bits at bit 29.
const ioIONone = 1 << 29
