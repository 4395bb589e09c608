package rnic

import (
	"github.com/rnic-dev/rnic/rnic/rdmap"
	"github.com/rnic-dev/rnic/rnic/term"
)

// localCatastrophic is the Terminate for local errors not tied to an inbound
// segment: RDMAP / Local Catastrophic Error, no echoed headers (draft
// Fig. 12, 23: code 0x0000).
var localCatastrophic = rdmap.TerminateFields{Cause: term.Cause{Layer: term.LayerRDMAP, EType: term.RDMALocalCatastrophic}}

// accessSite says what a peer's tagged access reached, which decides the
// layer that reports its faults.
type accessSite uint8

const (
	// sitePlacement: the sink of an RDMA Write or Read Response, checked
	// by DDP before placement (draft C14.1): DDP / Tagged Buffer errors.
	sitePlacement accessSite = iota
	// siteRequest: the data source of a Read Request or the target of an
	// Atomic Request, checked by RDMAP (RFC 5040 §7.2, RFC 7306 §8.2,
	// draft C13.5): RDMAP / Remote Protection errors, with the IRRQ events.
	siteRequest
)

// faultTerminate is the Terminate cause and the asynchronous event (draft
// §8.1) of an access fault.
type faultTerminate struct {
	cause term.Cause
	ev    EventType
}

func taggedFault(code term.Code, ev EventType) faultTerminate {
	return faultTerminate{term.Cause{Layer: term.LayerDDP, EType: term.DDPTagged, Code: code}, ev}
}

func protFault(code term.Code, ev EventType) faultTerminate {
	return faultTerminate{term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteProtection, Code: code}, ev}
}

// faultTerminates maps every access fault at each site to its Terminate
// (codes of RFC 5040 §4.8 Figure 9 and of DDP's Tagged Buffer errors). DDP
// has no code for missing access rights: a tagged access without the right
// is an Invalid STag, raised as the access rights event. A misaligned
// atomic target is a remote operation error, Catastrophic error localized
// to the stream (RFC 7306 §8.2); placement never checks alignment.
var faultTerminates = [...][faultAlignment + 1]faultTerminate{
	sitePlacement: {
		faultSTag:      taggedFault(term.TaggedInvalidSTag, EventInvalidSTag),
		faultPD:        taggedFault(term.TaggedNotAssociated, EventInvalidPD),
		faultRights:    taggedFault(term.TaggedInvalidSTag, EventAccessRights),
		faultBounds:    taggedFault(term.TaggedBaseBounds, EventBaseBounds),
		faultWrap:      taggedFault(term.TaggedTOWrap, EventWrap),
		faultAlignment: taggedFault(term.TaggedInvalidSTag, EventInvalidSTag),
	},
	siteRequest: {
		faultSTag:   protFault(term.ProtInvalidSTag, EventIRRQInvalidSTag),
		faultPD:     protFault(term.ProtSTagNotAssociated, EventIRRQInvalidPD),
		faultRights: protFault(term.ProtAccessRights, EventIRRQAccessRights),
		faultBounds: protFault(term.ProtBaseBounds, EventIRRQBaseBounds),
		faultWrap:   protFault(term.ProtTOWrap, EventIRRQWrap),
		faultAlignment: {term.Cause{Layer: term.LayerRDMAP, EType: term.RDMARemoteOperation, Code: term.OpCatastrophicStream},
			EventMisalignedAtomic},
	},
}

// terminate returns the Terminate cause and event of fault f at site s
// (f is not faultNone).
func (f accessFault) terminate(s accessSite) (term.Cause, EventType) {
	t := faultTerminates[s][f]
	return t.cause, t.ev
}
