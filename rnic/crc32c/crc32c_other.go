//go:build !amd64 && !arm64

package crc32c

// archKernels returns no assembly kernels: only the portable one exists
// outside amd64 and arm64.
func archKernels() []kernel { return nil }
