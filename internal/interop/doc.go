// Package interop holds the tests that run our RNIC against Linux
// soft-iWARP (siw) in a VM built by internal/linuxvm: rping in both roles with
// rdma-core's rping, perftest's ib_write_bw/ib_read_bw/ib_send_bw against
// our perftest server, for both siw builds (MPA revision 2 without CRC and
// revision 1 with CRC), each run captured on the host loopback and
// dissected by tshark. README.md lists what siw does on the wire.
package interop
