package ddp

// Header sizes and the DDP version this package speaks.
const (
	TaggedHeaderLen   = 14 // DDP control, RDMAP control, STag, TO
	UntaggedHeaderLen = 18 // DDP control, RDMAP control, RsvdULP1, QN, MSN, MO
	Version           = 1  // DV = 01b (RFC 5041)
)

// Bits of the DDP control byte (ULPDU byte 0).
const (
	FlagTagged   = 0x80 // T: tagged buffer model
	FlagLast     = 0x40 // L: last segment of a message
	maskReserved = 0x3C // Rsvd: zero on transmit, not checked on receive
	maskVersion  = 0x03 // DV
)

// IsTagged reports whether a DDP control byte has the T bit set.
func IsTagged(b0 byte) bool { return b0&FlagTagged != 0 }

// ctrl builds a DDP control byte for a header of the given model.
func ctrl(tagged, last bool) byte {
	b := byte(Version)
	if tagged {
		b |= FlagTagged
	}
	if last {
		b |= FlagLast
	}
	return b
}

func setLast(b *byte, last bool) {
	if last {
		*b |= FlagLast
	} else {
		*b &^= FlagLast
	}
}
