package nbd

import (
	"bufio"
	"context"
	"fmt"
	"net"
)

// TransmissionFlags are the transmission flags Export e is advertised with
// (NBD_FLAG_*), for a caller that hands them to the Linux kernel itself
// (NBD_SET_FLAGS) because it did the handshake out of band.
func (e Export) TransmissionFlags() uint16 { return e.withDefaults().transmissionFlags() }

// ServeTransmission serves one connection that starts in the transmission
// phase, with the named export. This is how the Linux kernel's NBD driver
// talks once it was given a socket with NBD_SET_SOCK: the handshake (size,
// block size, flags) was done by ioctls, so no greeting or options cross
// the socket. It returns when the kernel disconnects or ctx ends, and
// closes nc.
func (s *Server) ServeTransmission(ctx context.Context, nc net.Conn, export string) error {
	cfg, err := s.config()
	if err != nil {
		nc.Close()
		return err
	}
	exp, ok := cfg.lookup(export)
	if !ok {
		nc.Close()
		return fmt.Errorf("nbd: no export %q", export)
	}
	defer nc.Close()
	c := &conn{
		cfg:  cfg,
		nc:   nc,
		br:   bufio.NewReaderSize(nc, ioBufSize),
		bw:   bufio.NewWriterSize(nc, ioBufSize),
		log:  cfg.log.With("remote", "kernel"),
		pool: &bufPool{},
	}
	stop := context.AfterFunc(ctx, c.shutdown)
	defer stop()
	sel := selected{exp: exp, size: exp.Backend.Size(), flags: exp.transmissionFlags(), blockSize: true}
	if sel.size < 0 {
		return fmt.Errorf("nbd: export %q reports size %d", exp.Name, sel.size)
	}
	return c.transmit(ctx, sel)
}
