//go:build !(mips || mipsle || mips64 || mips64le || ppc || ppc64 || ppc64le || sparc || sparc64)

package main

// ioIONone is _IOC(_IOC_NONE, 0, 0, 0) in the kernel's asm-generic/ioctl.h,
// which most architectures use: _IOC_NONE is 0.
const ioIONone = 0
