package ddp

import "github.com/rnic-dev/rnic/rnic/term"

// ParseTagged checks the tagged header at the start of a ULPDU and returns a
// view of its first TaggedHeaderLen bytes. A short segment, T=0 or DV != 1
// is DDP / Tagged Buffer Error / Invalid DDP Version (1/1/0x04).
func ParseTagged(ulpdu []byte) (Tagged, error) {
	if len(ulpdu) < TaggedHeaderLen {
		return nil, term.Errorf(term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion,
			"tagged DDP segment of %d bytes, shorter than its %d-byte header", len(ulpdu), TaggedHeaderLen)
	}
	b0 := ulpdu[0]
	if !IsTagged(b0) {
		return nil, term.Errorf(term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion,
			"DDP control 0x%02X has T=0 where a tagged header was expected", b0)
	}
	if dv := b0 & maskVersion; dv != Version {
		return nil, term.Errorf(term.LayerDDP, term.DDPTagged, term.TaggedInvalidVersion,
			"DDP version %d in control byte 0x%02X, want %d", dv, b0, Version)
	}
	return Tagged(ulpdu[:TaggedHeaderLen:TaggedHeaderLen]), nil
}

// ParseUntagged checks the untagged header at the start of a ULPDU and
// returns a view of its first UntaggedHeaderLen bytes. A short segment, T=1
// or DV != 1 is DDP / Untagged Buffer Error / Invalid DDP Version
// (1/2/0x06). The queue and sequence fields are RxQueues' to check.
func ParseUntagged(ulpdu []byte) (Untagged, error) {
	if len(ulpdu) < UntaggedHeaderLen {
		return nil, term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion,
			"untagged DDP segment of %d bytes, shorter than its %d-byte header", len(ulpdu), UntaggedHeaderLen)
	}
	b0 := ulpdu[0]
	if IsTagged(b0) {
		return nil, term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion,
			"DDP control 0x%02X has T=1 where an untagged header was expected", b0)
	}
	if dv := b0 & maskVersion; dv != Version {
		return nil, term.Errorf(term.LayerDDP, term.DDPUntagged, term.UntaggedInvalidVersion,
			"DDP version %d in control byte 0x%02X, want %d", dv, b0, Version)
	}
	return Untagged(ulpdu[:UntaggedHeaderLen:UntaggedHeaderLen]), nil
}
