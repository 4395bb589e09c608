package blockproto

import "unicode/utf8"

// MaxName is the longest initiator or volume name, and the longest detail
// text of a response.
const MaxName = 255

// validText reports whether b is valid UTF-8 without control characters.
func validText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// ValidName reports whether s can be sent as an initiator or volume name:
// 1 to 255 bytes of UTF-8 without control characters.
func ValidName(s string) bool {
	return len(s) >= 1 && len(s) <= MaxName && validText([]byte(s))
}
