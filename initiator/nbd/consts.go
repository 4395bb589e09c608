package nbd

import "github.com/pojntfx/go-nbd/pkg/protocol"

// Wire constants. Where github.com/pojntfx/go-nbd/pkg/protocol defines a
// value it is used from there; the rest (which go-nbd v0.3.2 lacks) are
// defined here with the names of the NBD protocol specification.

// Magic numbers.
const (
	magicInit        = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption      = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicOptionReply = protocol.NEGOTIATION_MAGIC_REPLY
	magicRequest     = protocol.TRANSMISSION_MAGIC_REQUEST
	magicSimpleReply = protocol.TRANSMISSION_MAGIC_REPLY
	// magicStructuredReply starts a structured reply chunk.
	magicStructuredReply = uint32(0x668e33ef)
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes      = uint16(1 << 1)

	clientFlagFixedNewstyle = uint32(1 << 0)
	clientFlagNoZeroes      = uint32(1 << 1)
	clientFlagsKnown        = clientFlagFixedNewstyle | clientFlagNoZeroes
)

// Transmission flags, sent in NBD_INFO_EXPORT and after NBD_OPT_EXPORT_NAME.
const (
	FlagHasFlags        = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	FlagReadOnly        = uint16(1 << 1)
	FlagSendFlush       = uint16(1 << 2)
	FlagSendFUA         = uint16(1 << 3)
	FlagRotational      = uint16(1 << 4)
	FlagSendTrim        = uint16(1 << 5)
	FlagSendWriteZeroes = uint16(1 << 6)
	FlagSendDF          = uint16(1 << 7)
	FlagCanMultiConn    = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN
	FlagSendCache       = uint16(1 << 10)
	FlagSendFastZero    = uint16(1 << 11)
)

// Options (NBD_OPT_*).
const (
	OptExportName      = uint32(1)
	OptAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	OptList            = protocol.NEGOTIATION_ID_OPTION_LIST
	OptStartTLS        = uint32(5)
	OptInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	OptGo              = protocol.NEGOTIATION_ID_OPTION_GO
	OptStructuredReply = uint32(8)
	OptListMetaContext = uint32(9)
	OptSetMetaContext  = uint32(10)
	OptExtendedHeaders = uint32(11)
)

// Option reply types (NBD_REP_*). Errors have bit 31 set.
const (
	RepAck             = protocol.NEGOTIATION_TYPE_REPLY_ACK
	RepServer          = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	RepInfo            = protocol.NEGOTIATION_TYPE_REPLY_INFO
	RepMetaContext     = uint32(4)
	RepErrUnsup        = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	RepErrPolicy       = uint32(2 | 1<<31)
	RepErrInvalid      = uint32(3 | 1<<31)
	RepErrPlatform     = uint32(4 | 1<<31)
	RepErrTLSReqd      = uint32(5 | 1<<31)
	RepErrUnknown      = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	RepErrShutdown     = uint32(7 | 1<<31)
	RepErrBlockSizeReq = uint32(8 | 1<<31)
	RepErrTooBig       = uint32(9 | 1<<31)
)

// Information types in NBD_REP_INFO replies (NBD_INFO_*).
const (
	InfoTypeExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	InfoTypeName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	InfoTypeDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	InfoTypeBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Commands (NBD_CMD_*).
const (
	CmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	CmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	CmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	CmdFlush       = uint16(3)
	CmdTrim        = uint16(4)
	CmdCache       = uint16(5)
	CmdWriteZeroes = uint16(6)
	CmdBlockStatus = uint16(7)
)

// Structured reply chunk flags and types (NBD_REPLY_FLAG_*,
// NBD_REPLY_TYPE_*).
const (
	ReplyFlagDone        = uint16(1 << 0)
	ReplyTypeNone        = uint16(0)
	ReplyTypeOffsetData  = uint16(1)
	ReplyTypeOffsetHole  = uint16(2)
	ReplyTypeBlockStatus = uint16(5)
	ReplyTypeError       = uint16(1<<15 | 1)
	ReplyTypeErrorOffset = uint16(1<<15 | 2)
)

// The metadata context this server offers, and its flags (NBD_STATE_*).
const (
	MetaBaseAllocation = "base:allocation"
	// metaAllocID is the context ID NBD_OPT_SET_META_CONTEXT gives
	// base:allocation.
	metaAllocID = uint32(1)
	StateHole   = uint32(1 << 0)
	StateZero   = uint32(1 << 1)
)

// Command flags (NBD_CMD_FLAG_*).
const (
	CmdFlagFUA      = uint16(1 << 0)
	CmdFlagNoHole   = uint16(1 << 1)
	CmdFlagDF       = uint16(1 << 2)
	CmdFlagReqOne   = uint16(1 << 3)
	CmdFlagFastZero = uint16(1 << 4)
)

// Error values of the transmission phase (NBD_E*). They are the Linux
// errno numbers of the same name.
const (
	EPERM     = protocol.TRANSMISSION_ERROR_EPERM
	EIO       = uint32(5)
	ENOMEM    = uint32(12)
	EINVAL    = protocol.TRANSMISSION_ERROR_EINVAL
	ENOSPC    = uint32(28)
	EOVERFLOW = uint32(75)
	ENOTSUP   = uint32(95)
	ESHUTDOWN = uint32(108)
)

// Protocol limits.
const (
	// maxString is the longest string (export name, description, error
	// message) the specification allows.
	maxString = 4096
	// maxOptionData bounds the data of one option the server buffers;
	// longer options are skipped and answered with NBD_REP_ERR_TOO_BIG.
	maxOptionData = 64 << 10
	// interopPayload is the payload size the specification says SHOULD
	// NOT be treated as a denial of service even when larger than the
	// advertised maximum (2^25).
	interopPayload = 32 << 20
)
