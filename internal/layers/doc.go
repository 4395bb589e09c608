// Package layers holds the test of the module's layer order: every import
// between the module's packages goes down this order, never up or
// sideways, and the storage side never reaches the RDMA side.
//
//	rnic/crc32c, rnic/term      CRC32c kernels; Terminate causes
//	rnic/mpa                    MPA framing (RFC 5044)
//	rnic/ddp                    DDP segments (RFC 5041)
//	rnic/rdmap                  RDMAP messages (RFC 5040, RFC 7306)
//	rnic                        the engine and its verbs
//	blockproto                  the block service's wire protocol
//	target, initiator           its two ends
//	cmd/...                     the commands
//
// store (and its backends) may use rnic/crc32c and nothing of RDMA.
// Packages used only by tests (internal/rawpeer, internal/wiretest,
// internal/linuxvm, store/storetest, ...) and the applications of the
// engine (internal/rping, internal/perftest) sit at the level of what they
// import; a test-only package may be imported by tests alone. Tests follow
// the same order, except that they may use packages of their own level (the
// initiator's tests run a real target) and that the tests of the test-only
// packages may use anything. The table in layers_test.go places every
// package of the module: a new package fails the test until it is placed
// there.
package layers
