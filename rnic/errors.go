package rnic

import "errors"

// Immediate errors (draft §8.3.1, §9.5.1): returned by a verb, which then
// leaves its subject unchanged. Callers match them with errors.Is; the engine
// wraps them with context.
var (
	ErrInsufficientResources = errors.New("insufficient resources")
	ErrInvalidModifier       = errors.New("invalid modifier")
	ErrClosed                = errors.New("RNIC closed")
	ErrInvalidPD             = errors.New("invalid PD ID")
	ErrPDInUse               = errors.New("protection domain is in use")
	ErrCQExceedsCapability   = errors.New("number of CQ entries exceeds RNIC capability")
	ErrCQShrink              = errors.New("CQ shrink failed: too many entries present")
	ErrInvalidCQ             = errors.New("invalid CQ handle")
	ErrCQInUse               = errors.New("CQ in use")
	ErrInvalidHandler        = errors.New("invalid completion event handler identifier")
	ErrInvalidSRQ            = errors.New("invalid S-RQ handle")
	ErrSRQInUse              = errors.New("QPs still associated with the S-RQ")
	ErrSRQLimit              = errors.New("S-RQ limit out of range")
	ErrWRExceedsCapability   = errors.New("maximum WRs exceeds RNIC capability")
	ErrSGEExceedsCapability  = errors.New("maximum SGEs exceeds RNIC capability")
	ErrIRDExceedsCapability  = errors.New("IRD exceeds RNIC capability")
	ErrORDExceedsCapability  = errors.New("ORD exceeds RNIC capability")
	ErrInvalidQP             = errors.New("invalid QP handle")
	ErrCannotChangeAttribute = errors.New("cannot change QP attribute")
	ErrShrink                = errors.New("shrink failed: too many elements present")
	ErrInvalidStateChange    = errors.New("invalid QP state change requested")
	ErrInvalidStream         = errors.New("invalid LLP stream handle")
	ErrFlushing              = errors.New("RI still flushing WQEs")
	ErrRQLimit               = errors.New("QP RQ limit out of range")
	ErrMWBoundToQP           = errors.New("memory windows still bound to QP")
	ErrInvalidVA             = errors.New("invalid virtual address")
	ErrInvalidLength         = errors.New("invalid length")
	ErrInvalidAccess         = errors.New("invalid access rights requested")
	ErrInvalidPBLEntry       = errors.New("invalid physical buffer list entry")
	ErrInvalidBufferSize     = errors.New("invalid physical buffer size")
	ErrInvalidSTag           = errors.New("invalid STag index")
	ErrInvalidFBO            = errors.New("invalid first byte offset")
	ErrMWBound               = errors.New("one or more memory windows still bound")
	ErrTooManyWRs            = errors.New("too many work requests posted")
	ErrInvalidOp             = errors.New("invalid operation type")
	ErrInvalidQPState        = errors.New("invalid QP state")
	ErrInvalidSGLFormat      = errors.New("invalid scatter/gather list format")
	ErrInvalidSGLLength      = errors.New("invalid scatter/gather list length")
	ErrRQHasSRQ              = errors.New("RQ associated with S-RQ")
	ErrNotPrivileged         = errors.New("QP not in privileged mode")
)

// Connection errors.
var (
	ErrRejected    = errors.New("connection rejected by peer")
	ErrMPA         = errors.New("MPA negotiation failed")
	ErrQPNotIdle   = errors.New("QP is not idle")
	ErrNotAccepted = errors.New("connection request already answered")
)
