package blockproto

import "fmt"

// Status is the outcome of a command, or the reason of a REJECT or GOODBYE.
type Status uint16

// Status codes.
const (
	StatusOK         Status = 0
	StatusInvalid    Status = 1  // malformed or misaligned request
	StatusRange      Status = 2  // beyond the end of the volume
	StatusIO         Status = 3  // the store failed
	StatusReserved   Status = 4  // another session holds a reservation that forbids this
	StatusStaleToken Status = 5  // the fencing token is stale
	StatusReadOnly   Status = 6  // the volume is exported read-only
	StatusAuth       Status = 7  // authentication failed
	StatusVersion    Status = 8  // unsupported protocol version
	StatusNoVolume   Status = 9  // no such volume
	StatusBusy       Status = 10 // a resource limit of the target was reached
	StatusShutdown   Status = 11 // the target is shutting down
	StatusProtocol   Status = 12 // protocol violation
	StatusNoSession  Status = 13 // JOIN names no live session
	StatusTooLarge   Status = 14 // length above the advertised maximum transfer
	StatusChecksum   Status = 15 // stored data failed its checksum
	StatusNoSpace    Status = 16 // the store has no space for the write (a thin pool is full)
)

var statusNames = [...]string{
	StatusOK: "ok", StatusInvalid: "invalid request", StatusRange: "out of range", StatusIO: "I/O error",
	StatusReserved: "volume reserved", StatusStaleToken: "stale fencing token", StatusReadOnly: "read-only volume",
	StatusAuth: "authentication failed", StatusVersion: "unsupported protocol version", StatusNoVolume: "no such volume",
	StatusBusy: "target busy", StatusShutdown: "target shutting down", StatusProtocol: "protocol violation",
	StatusNoSession: "no such session", StatusTooLarge: "request too large", StatusChecksum: "stored data corrupt",
	StatusNoSpace: "no space left in the store",
}

func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint16(s))
}

// Known reports whether s is a status this version defines.
func (s Status) Known() bool { return int(s) < len(statusNames) && statusNames[s] != "" }

// GoodbyeSynced is the Value of a GOODBYE sent after the target flushed:
// every write acknowledged before it is durable.
const GoodbyeSynced = 1
