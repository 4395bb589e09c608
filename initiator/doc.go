// Package initiator is the client side of the block protocol
// (package blockproto): a Client logs in to one volume of a target and
// reads, writes, flushes, trims and takes locks on it.
//
// # Sessions and QPs
//
// A session is one login: Config.QPs QPs (each an internal/endpoint
// Endpoint in the session's protection domain) that joined it, each with
// the credits (slots) and write grants its WELCOME gave. A request takes a
// free slot of some QP (small requests fill the first QP before the next,
// so that a burst shares writes and wake-ups; large ones take the QPs in
// turn) and runs one exchange on it; the QP's completion handler advances
// the exchange as the target's answers arrive. When the session is lost,
// the requests in flight fail over to the next session: the client logs in
// again (with backoff) and replays them.
//
// # The data path
//
// Every request is started, then completed by the handler: the blocking
// calls (ReadAt, WriteAt, ...) start one and wait for its outcome;
// StartRead and StartWrite report it to a Completion instead, from the
// handler that saw the answer, and flush the Completions' Flushers once per
// batch of completions, so a front end (package initiator/nbd) sends the
// replies of a burst together, with no goroutine per request and no
// hand-off between goroutines. The caller's buffer is the RDMA source or
// sink itself: a READ's data comes inline in the target's DATA (up to the
// inline size) and is copied out of the receive buffer, or is read with an
// RDMA Read into the caller's buffer; a WRITE's data leaves the caller's
// buffer with an RDMA Write. For the transfer the buffer is
// Fast-Registered under the slot's own STag, with a fresh key each time,
// and invalidated right after it (a READ's RDMA Read with Invalidate Local
// STag, so before its completion), so the RNIC reaches the caller's
// memory only while the exchange needs it. A WRITE ends at the target's
// RESPONSE; its Invalidate is posted with the RDMA Write but not waited
// for. The handler believes the RESPONSE only once the transmitter has
// gathered the WRITE's Send (rnic.QP.SendGathered), so it has read all of the
// buffer: a target answering a WRITE it cannot have received is a
// protocol error, and the QP stops before the caller gets the buffer
// back. A blocking caller
// whose context ends while the exchange has its buffer mapped waits for
// the transfer (two seconds at most; then the QP is reset, which stops
// the RNIC, and the session is replaced).
//
// # Failover
//
// Config.Addr may list several targets serving the same volume in turn
// (gateways in front of one cluster). The client logs in to the first that
// accepts; when the session is lost it tries the others, the one that
// failed last. A heartbeat (an RDMA atomic on the lock table, answered by
// the target's RNIC without its store) detects a target that stopped
// answering while its connection stays up. The client retries failures a
// new attempt may cure (no answer, a refused connection, a target
// shutting down) for as long as it takes; it gives up only when every
// target in turn refused the login for good (authentication, no such
// volume, version, protocol), or at the first loss with NoReconnect:
// then Client.GaveUp is closed and every request fails with Client.Err.
package initiator
