package term

import "testing"

func TestCauseNames(t *testing.T) {
	for _, c := range []struct {
		cause Cause
		name  string
		str   string
	}{
		{Cause{LayerRDMAP, RDMARemoteProtection, ProtInvalidSTag}, "invalid STag", "RDMAP/1/0x00 invalid STag"},
		{Cause{LayerRDMAP, RDMARemoteOperation, OpCatastrophicStream}, "catastrophic error, localized to RDMAP stream", ""},
		{Cause{LayerDDP, DDPTagged, TaggedNotAssociated}, "STag not associated with DDP stream", ""},
		{Cause{LayerDDP, DDPUntagged, UntaggedNoBuffer}, "invalid MSN - no buffer available", "DDP/2/0x02 invalid MSN - no buffer available"},
		{Cause{LayerLLP, LLPMPA, MPACRC}, "MPA CRC error", "LLP/0/0x02 MPA CRC error"},
		{Cause{LayerLLP, LLPMPA, MPANoMatchingRTR}, "no matching RTR option", ""},
		// Local catastrophic errors have no code: any value names the type.
		{Cause{LayerRDMAP, RDMALocalCatastrophic, 0x00}, "local catastrophic error", ""},
		{Cause{LayerRDMAP, RDMALocalCatastrophic, 0x42}, "local catastrophic error", ""},
		{Cause{LayerDDP, DDPLocalCatastrophic, 0xFF}, "DDP local catastrophic error", ""},
		// Codes an error type does not have, and types and layers that do
		// not exist.
		{Cause{LayerRDMAP, RDMARemoteProtection, 0x05}, "unknown", ""},
		{Cause{LayerDDP, DDPTagged, 0x05}, "unknown", ""},
		{Cause{LayerLLP, LLPMPA, 0x00}, "unknown", ""},
		{Cause{LayerLLP, 1, MPACRC}, "unknown", ""},
		{Cause{3, 0, 0}, "unknown", "layer(3)/0/0x00 unknown"},
	} {
		if got := c.cause.Name(); got != c.name {
			t.Errorf("%d/%d/0x%02X: name %q, want %q", c.cause.Layer, c.cause.EType, c.cause.Code, got, c.name)
		}
		if c.str != "" && c.cause.String() != c.str {
			t.Errorf("String %q, want %q", c.cause.String(), c.str)
		}
		if b := FromBytes(c.cause.Byte0(), byte(c.cause.Code)); b != c.cause {
			t.Errorf("%v: bytes %02x %02x decode to %v", c.cause, c.cause.Byte0(), byte(c.cause.Code), b)
		}
	}
	if len(names) != 31 {
		t.Errorf("%d named causes, want the 31 of RFC 5040 Figure 9, DDP and MPA", len(names))
	}
}
