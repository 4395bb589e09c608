// Package nvmf is rtarget's NVMe over Fabrics front end on RDMA: the Linux
// kernel's own NVMe/RDMA host (nvme-rdma, over soft-iWARP on any NIC)
// attaches the target's volumes with `nvme connect -t rdma`, one hop into
// its block layer, with nothing of ours on the host.
//
// Every volume of the store is namespace 1 of its own NVM subsystem, NQN
// "nqn.2026-11.dev.rnic:NAME" (subsystem.go); a discovery controller lists
// the subsystems a host may reach and whose volume is available (a raw
// volume whose file is gone is left out; discovery.go). Queues are RNIC QPs on
// this module's engine (rnic/), each on an internal/endpoint Endpoint, and
// data buffers come from its budgeted Pool. Where things happen:
//
//	cm.go          the RDMA CM private data of a queue's connection: request, reply, reject
//	listen.go      a connection request becomes a queue (receives posted before the MPA Reply)
//	capsule.go     command (SQE), completion (CQE) and Connect data wire views
//	sgl.go         SGL descriptors: keyed (host memory) or in-capsule data
//	queue.go       a queue: QP, receive buffers, command slots, the poller, teardown
//	transfer.go    data movement (RDMA Read / RDMA Write against the host's key) and completions
//	fabrics.go     Connect and Property Get/Set: controllers and their registers
//	controller.go  a controller: CC/CSTS, its queues, its hold on the volume
//	keepalive.go   the keep alive timer
//	admin.go       admin command dispatch, Asynchronous Event Request, Keep Alive, Abort
//	identify.go    Identify: controller, namespace, namespace lists and descriptors
//	features.go    Get/Set Features
//	logpage.go     Get Log Page: error, SMART, firmware
//	discovery.go   the discovery log page
//	io.go          the NVM command set: where an NVMe command becomes a block request
//	reservation.go reservations, on the volume's lock table shared with the native protocol
//	status.go      NVMe status codes
//
// Access: a volume admits the host NQNs on its allow-list (Config.Hosts),
// or, without one, hosts connecting from a loopback address. NVMe in-band
// authentication (DH-HMAC-CHAP) is not implemented: Debian 12's kernel is
// built without CONFIG_NVME_AUTH, so no host here could use or test it;
// Connect never asks for it and Authentication Send/Receive are refused.
// A host NQN is a claim, not a proof: on an untrusted network keep the
// listener on a trusted address.
package nvmf
