//go:build !linux

package rnic

import "net"

// peerReset cannot tell a reset from a FIN after EOF on this system.
func peerReset(net.Conn) bool { return false }

// vecRead has no state where readv is not used.
type vecRead struct{}

// readVec reads into a only.
func (c *conn) readVec(a, _ []byte) (int, error) { return c.nc.Read(a) }
