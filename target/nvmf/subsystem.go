package nvmf

import (
	"strings"
	"unicode/utf8"
)

// Subsystems: every volume of the store is namespace 1 of its own NVM
// subsystem, NQN Config.NQNPrefix + the volume's name
// ("nqn.2026-11.dev.rnic:NAME" by default), reachable by the hosts on its
// allow-list (Config.Hosts), or by any host on a loopback address when it
// has none. The discovery subsystem lists, to each host, the subsystems it
// may reach.

// ValidNQN reports whether s has the shape of an NQN (NVMe Base 2.0
// §4.5): "nqn." then at least one more byte, at most MaxNQNLen bytes of
// UTF-8 without NUL or control characters.
func ValidNQN(s string) bool {
	if len(s) <= 4 || len(s) > MaxNQNLen || !strings.HasPrefix(s, "nqn.") || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// SubsystemNQN is volume's subsystem NQN under prefix ("" means
// DefaultNQNPrefix), or "" if it would exceed MaxNQNLen bytes (such a
// volume is not served over NVMe/RDMA).
func SubsystemNQN(prefix, volume string) string {
	if prefix == "" {
		prefix = DefaultNQNPrefix
	}
	n := prefix + volume
	if !ValidNQN(n) {
		return ""
	}
	return n
}
