package nvmf

import (
	"context"
	"encoding/binary"
	"time"
)

// Get Log Page (NVMe Base 2.0 §5.16): the error information log (no
// entries are kept: all zero), SMART / health information (the host's
// I/O counted on this controller), the firmware slot information, and on
// a discovery controller the discovery log (discovery.go). The offset
// (LPO) and 32-bit lengths are honoured (LPA bit 2).

// Log page identifiers.
const (
	LogError     = 0x01
	LogSMART     = 0x02
	LogFirmware  = 0x03
	LogDiscovery = 0x70
)

// compositeTemp is the composite temperature SMART reports, in kelvins.
const compositeTemp = 298

const (
	smartLen    = 512
	firmwareLen = 512
	errorLogLen = 64 // one entry (ELPE 0)
)

func (c *controller) getLogPage(q *queue, sl *slot, cmd Command) {
	lid := cmd.CDW(10) & 0xff
	numd := uint64(cmd.CDW(11)&0xffff)<<16 | uint64(cmd.CDW(10)>>16) + 1
	lpo := uint64(cmd.CDW(12)) | uint64(cmd.CDW(13))<<32
	n := numd * 4
	switch {
	case n > uint64(c.s.cfg.MaxTransfer):
		q.complete(sl, 0, fail(StatusInvalidField, "log page read of %d bytes, at most %d", n, c.s.cfg.MaxTransfer))
		return
	case lpo%4 != 0:
		q.complete(sl, 0, fail(StatusInvalidField, "log page offset %d is not a multiple of 4", lpo))
		return
	}
	page := func(build func() []byte) {
		p := build()
		if lpo > uint64(len(p)) {
			q.complete(sl, 0, fail(StatusInvalidField, "log page offset %d past its %d bytes", lpo, len(p)))
			return
		}
		c.reply(q, sl, int(n), 0, func(b []byte) { clear(b[copy(b, p[lpo:]):]) })
	}
	switch {
	case lid == LogError:
		page(func() []byte { return make([]byte, errorLogLen) })
	case lid == LogSMART && !c.disc:
		page(c.smartLog)
	case lid == LogFirmware && !c.disc:
		page(func() []byte {
			b := make([]byte, firmwareLen)
			b[0] = 1 // slot 1 active
			padded(b[8:16], "1.0")
			return b
		})
	case lid == LogDiscovery && c.disc:
		// Listing the volumes may wait for the store.
		q.run(sl, false, func(sl *slot) {
			ctx, cancel := context.WithTimeout(q.ctx, 30*time.Second)
			defer cancel()
			log, err := c.discoveryLog(ctx)
			if err != nil {
				q.log.Error("discovery log: listing volumes", "err", err)
				q.complete(sl, 0, fail(StatusInternal, "listing volumes: %v", err))
				return
			}
			page(func() []byte { return log })
		})
	default:
		q.complete(sl, 0, fail(StatusInvalidLogPage, "log page 0x%02x", lid))
	}
}

// smartLog is the SMART / health information log: 25 °C (critical
// warning bit 1 if that is at or past a temperature threshold the host
// set), all spare available, and the data units (thousands of 512-byte
// units, rounded up) and commands this controller's host read and wrote.
func (c *controller) smartLog() []byte {
	b := make([]byte, smartLen)
	c.mu.Lock()
	over, under := c.tempOver, c.tempUnder
	c.mu.Unlock()
	if compositeTemp >= over || compositeTemp <= under {
		b[0] |= 1 << 1
	}
	binary.LittleEndian.PutUint16(b[1:], compositeTemp)
	b[3], b[4] = 100, 10 // available spare, its threshold
	units := func(bytes uint64) uint64 { return (bytes/512 + 999) / 1000 }
	binary.LittleEndian.PutUint64(b[32:], units(c.bytesRead.Load()))
	binary.LittleEndian.PutUint64(b[48:], units(c.bytesWritten.Load()))
	binary.LittleEndian.PutUint64(b[64:], c.reads.Load())
	binary.LittleEndian.PutUint64(b[80:], c.writes.Load())
	return b
}
