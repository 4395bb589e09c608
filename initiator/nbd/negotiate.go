package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// selected is the outcome of a successful handshake.
type selected struct {
	exp       Export
	size      int64
	flags     uint16
	blockSize bool   // the client asked for NBD_INFO_BLOCK_SIZE in NBD_OPT_GO
	via       uint32 // OptGo or OptExportName
	// structured: structured replies were negotiated; metaAlloc: and the
	// base:allocation context was selected for this export, so
	// NBD_CMD_BLOCK_STATUS is answered.
	structured, metaAlloc bool
}

// errAborted ends a handshake the client gave up on (NBD_OPT_ABORT, or
// closing the connection between options). It is not reported as an error.
var errAborted = errors.New("nbd: client ended the handshake")

// negotiate runs the fixed newstyle handshake up to the transmission phase.
func (c *conn) negotiate() (selected, error) {
	var g [GreetingSize]byte
	Greeting(g[:]).Encode(protocol.NegotiationNewstyleHeader{
		OldstyleMagic:  magicInit,
		OptionMagic:    magicOption,
		HandshakeFlags: flagFixedNewstyle | flagNoZeroes,
	})
	if _, err := c.bw.Write(g[:]); err != nil {
		return selected{}, fmt.Errorf("nbd: send greeting: %w", err)
	}
	if err := c.bw.Flush(); err != nil {
		return selected{}, fmt.Errorf("nbd: send greeting: %w", err)
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return selected{}, errAborted
		}
		return selected{}, fmt.Errorf("nbd: read client flags: %w", err)
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&^clientFlagsKnown != 0 {
		return selected{}, fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, clientFlags)
	}
	c.noZeroes = clientFlags&clientFlagNoZeroes != 0

	var oh [OptionSize]byte
	for {
		if _, err := io.ReadFull(c.br, oh[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return selected{}, errAborted
			}
			return selected{}, fmt.Errorf("nbd: read option header: %w", err)
		}
		o := Option(oh[:])
		if o.Magic() != magicOption {
			return selected{}, fmt.Errorf("%w: option magic %#x, want %#x", ErrProtocol, o.Magic(), magicOption)
		}
		id, length := o.ID(), o.Length()
		if length > maxOptionData {
			if id == OptExportName {
				return selected{}, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME of %d bytes", ErrProtocol, length)
			}
			if _, err := io.CopyN(io.Discard, c.br, int64(length)); err != nil {
				return selected{}, fmt.Errorf("nbd: skip option %d data: %w", id, err)
			}
			if id == OptAbort {
				// ABORT's data is ignored whatever its length: the
				// specification asks for an ACK, not an error.
				sel, _, err := c.option(id, nil)
				return sel, err
			}
			if err := c.optError(id, RepErrTooBig, "option data of %d bytes is too long", length); err != nil {
				return selected{}, err
			}
			continue
		}
		data := make([]byte, length)
		if _, err := io.ReadFull(c.br, data); err != nil {
			return selected{}, fmt.Errorf("nbd: read option %d data: %w", id, err)
		}
		sel, done, err := c.option(id, data)
		if err != nil || done {
			return sel, err
		}
	}
}

// option answers one option. done reports that the handshake is over
// (transmission starts if err is nil).
func (c *conn) option(id uint32, data []byte) (sel selected, done bool, err error) {
	c.log.Debug("nbd: option", "option", optionName(id), "length", len(data))
	switch id {
	case OptExportName:
		if len(data) > maxString {
			return selected{}, true, fmt.Errorf("%w: export name of %d bytes", ErrProtocol, len(data))
		}
		exp, ok := c.cfg.lookup(string(data))
		if !ok {
			// The protocol gives no way to refuse EXPORT_NAME but closing.
			return selected{}, true, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME for unknown export %q", ErrProtocol, data)
		}
		sel = selected{exp: exp, size: exp.Backend.Size(), flags: exp.transmissionFlags(), via: OptExportName}
		c.negotiated(&sel)
		if sel.size < 0 {
			return selected{}, true, fmt.Errorf("nbd: export %q reports size %d", exp.Name, sel.size)
		}
		var b [ExportNameReplySize + exportNameZeroes]byte
		binary.BigEndian.PutUint64(b[0:], uint64(sel.size))
		binary.BigEndian.PutUint16(b[8:], sel.flags)
		n := len(b)
		if c.noZeroes {
			n = ExportNameReplySize
		}
		if _, err := c.bw.Write(b[:n]); err != nil {
			return selected{}, true, fmt.Errorf("nbd: reply to NBD_OPT_EXPORT_NAME: %w", err)
		}
		return sel, true, c.flush()

	case OptAbort:
		// Data, if any, is ignored as the specification asks. The client
		// may already have closed; a failed ACK does not matter.
		_ = c.optReply(id, RepAck)
		_ = c.flush()
		return selected{}, true, errAborted

	case OptList:
		if len(data) != 0 {
			return selected{}, false, c.optError(id, RepErrInvalid, "NBD_OPT_LIST takes no data")
		}
		for _, e := range c.cfg.exports {
			var name []byte
			name = binary.BigEndian.AppendUint32(name, uint32(len(e.Name)))
			name = append(name, e.Name...)
			if err := c.optReply(id, RepServer, name, []byte(e.Description)); err != nil {
				return selected{}, false, err
			}
		}
		if err := c.optReply(id, RepAck); err != nil {
			return selected{}, false, err
		}
		return selected{}, false, c.flush()

	case OptInfo, OptGo:
		return c.info(id, data)

	case OptStructuredReply:
		if len(data) != 0 {
			return selected{}, false, c.optError(id, RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
		}
		c.structured = true
		if err := c.optReply(id, RepAck); err != nil {
			return selected{}, false, err
		}
		return selected{}, false, c.flush()

	case OptListMetaContext, OptSetMetaContext:
		return selected{}, false, c.metaContext(id, data)

	default:
		// NBD_OPT_STARTTLS, extended headers and anything unknown.
		return selected{}, false, c.optError(id, RepErrUnsup, "option %s is not supported by this server", optionName(id))
	}
}

// metaContext answers NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT. The one context offered is base:allocation,
// for exports whose Backend is a BlockStatuser. A listing matches it with
// no query, "base:" or its own name; a selection takes it when a query
// names it exactly, and replaces any earlier selection, also when it
// fails (as the specification requires). The selection is recorded for
// the export the name resolves to, so that the empty name selects for
// the default export.
func (c *conn) metaContext(id uint32, data []byte) error {
	if id == OptSetMetaContext {
		c.metaExport, c.metaAlloc = "", false
	}
	if !c.structured {
		return c.optError(id, RepErrInvalid, "%s before NBD_OPT_STRUCTURED_REPLY", optionName(id))
	}
	req, err := ParseMetaContextRequest(data)
	if err != nil {
		return c.optError(id, RepErrInvalid, "%v", err)
	}
	exp, ok := c.cfg.lookup(req.Name)
	if !ok {
		return c.optError(id, RepErrUnknown, "no export named %q", req.Name)
	}
	_, offered := exp.Backend.(BlockStatuser)
	match := false
	for _, q := range req.Queries {
		switch {
		case q == MetaBaseAllocation:
			match = true
		case q == "base:" && id == OptListMetaContext:
			match = true
		}
	}
	if id == OptListMetaContext && len(req.Queries) == 0 {
		match = true
	}
	match = match && offered
	if id == OptSetMetaContext {
		c.metaExport, c.metaAlloc = exp.Name, match
	}
	if match {
		ctxID := uint32(0) // a listing's IDs are reserved, 0
		if id == OptSetMetaContext {
			ctxID = metaAllocID
		}
		var h [4]byte
		binary.BigEndian.PutUint32(h[:], ctxID)
		if err := c.optReply(id, RepMetaContext, h[:], []byte(MetaBaseAllocation)); err != nil {
			return err
		}
	}
	if err := c.optReply(id, RepAck); err != nil {
		return err
	}
	return c.flush()
}

// negotiated records in sel what the options negotiated for its export:
// structured replies, and base:allocation if it was selected for that
// very export (by its name, or by the empty name if it is the default).
func (c *conn) negotiated(sel *selected) {
	sel.structured = c.structured
	sel.metaAlloc = c.structured && c.metaAlloc && c.metaExport == sel.exp.Name
}

// info answers NBD_OPT_INFO and NBD_OPT_GO.
func (c *conn) info(id uint32, data []byte) (selected, bool, error) {
	req, err := ParseInfoRequest(data)
	if err != nil {
		return selected{}, false, c.optError(id, RepErrInvalid, "%v", err)
	}
	exp, ok := c.cfg.lookup(req.Name)
	if !ok {
		return selected{}, false, c.optError(id, RepErrUnknown, "no export named %q", req.Name)
	}
	sel := selected{exp: exp, size: exp.Backend.Size(), flags: exp.transmissionFlags(), via: id,
		blockSize: id == OptGo && req.Wants(InfoTypeBlockSize)}
	c.negotiated(&sel)
	if sel.size < 0 {
		return selected{}, false, c.optError(id, RepErrUnknown, "export %q is unavailable", exp.Name)
	}

	var ie [InfoExportSize]byte
	InfoExport(ie[:]).Encode(protocol.NegotiationReplyInfo{
		Type: InfoTypeExport, Size: uint64(sel.size), TransmissionFlags: sel.flags,
	})
	if err := c.optReply(id, RepInfo, ie[:]); err != nil {
		return selected{}, false, err
	}
	// Size constraints are sent whether or not they were asked for (the
	// specification allows it, and libnbd and qemu honour them); the
	// server enforces them either way.
	var bs [InfoBlockSizeSize]byte
	InfoBlockSize(bs[:]).Encode(protocol.NegotiationReplyBlockSize{
		Type:               InfoTypeBlockSize,
		MinimumBlockSize:   exp.MinBlock,
		PreferredBlockSize: exp.PrefBlock,
		MaximumBlockSize:   exp.MaxBlock,
	})
	if err := c.optReply(id, RepInfo, bs[:]); err != nil {
		return selected{}, false, err
	}
	if req.Wants(InfoTypeName) || req.Name != exp.Name {
		var t [2]byte
		binary.BigEndian.PutUint16(t[:], InfoTypeName)
		if err := c.optReply(id, RepInfo, t[:], []byte(exp.Name)); err != nil {
			return selected{}, false, err
		}
	}
	if req.Wants(InfoTypeDescription) && exp.Description != "" {
		var t [2]byte
		binary.BigEndian.PutUint16(t[:], InfoTypeDescription)
		if err := c.optReply(id, RepInfo, t[:], []byte(exp.Description)); err != nil {
			return selected{}, false, err
		}
	}
	if err := c.optReply(id, RepAck); err != nil {
		return selected{}, false, err
	}
	if err := c.flush(); err != nil {
		return selected{}, false, err
	}
	return sel, id == OptGo, nil
}

// optReply buffers an option reply whose data is the concatenation of parts.
func (c *conn) optReply(id, typ uint32, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var h [OptionReplySize]byte
	OptionReply(h[:]).Encode(protocol.NegotiationReplyHeader{
		ReplyMagic: magicOptionReply, ID: id, Type: typ, Length: uint32(n),
	})
	if _, err := c.bw.Write(h[:]); err != nil {
		return fmt.Errorf("nbd: reply to option %d: %w", id, err)
	}
	for _, p := range parts {
		if _, err := c.bw.Write(p); err != nil {
			return fmt.Errorf("nbd: reply to option %d: %w", id, err)
		}
	}
	return nil
}

// optError sends an error reply with a message for humans.
func (c *conn) optError(id, typ uint32, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxString {
		msg = msg[:maxString]
	}
	c.log.Debug("nbd: option refused", "option", optionName(id), "reply", typ&^(1<<31), "msg", msg)
	if err := c.optReply(id, typ, []byte(msg)); err != nil {
		return err
	}
	return c.flush()
}

func (c *conn) flush() error {
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("nbd: send: %w", err)
	}
	return nil
}

// optionName names an option for logs and messages.
func optionName(id uint32) string {
	switch id {
	case OptExportName:
		return "NBD_OPT_EXPORT_NAME"
	case OptAbort:
		return "NBD_OPT_ABORT"
	case OptList:
		return "NBD_OPT_LIST"
	case OptStartTLS:
		return "NBD_OPT_STARTTLS"
	case OptInfo:
		return "NBD_OPT_INFO"
	case OptGo:
		return "NBD_OPT_GO"
	case OptStructuredReply:
		return "NBD_OPT_STRUCTURED_REPLY"
	case OptListMetaContext:
		return "NBD_OPT_LIST_META_CONTEXT"
	case OptSetMetaContext:
		return "NBD_OPT_SET_META_CONTEXT"
	case OptExtendedHeaders:
		return "NBD_OPT_EXTENDED_HEADERS"
	}
	return fmt.Sprintf("option %d", id)
}
