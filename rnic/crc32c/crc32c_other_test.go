//go:build !amd64 && !arm64

package crc32c

func expectedBest() string { return "generic" }
