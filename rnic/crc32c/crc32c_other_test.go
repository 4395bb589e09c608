//go:build !amd64

package crc32c

func expectedBest() string { return "generic" }
