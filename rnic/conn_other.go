//go:build !linux

package rnic

import "net"

// peerReset cannot tell a reset from a FIN after EOF on this system.
func peerReset(net.Conn) bool { return false }
