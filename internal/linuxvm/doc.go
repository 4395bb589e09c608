// Package linuxvm boots a small Debian-kernel virtual machine under QEMU
// (software emulation, no KVM needed) that carries real Linux interop peers:
// soft-iWARP (siw, built from Debian's linux-source in two variants), rdma-core
// (rping, ibv_devinfo), perftest (ib_write_bw, ib_read_bw, ib_send_bw) and the
// kernel NBD client.
//
// Ensure builds the VM into a cache directory by running the embedded build.sh
// (idempotent: it does nothing when the cached VM matches its inputs). Boot
// starts one VM running a guest shell script from a host directory shared over
// 9p (mounted at /host), with host 127.0.0.1 ports forwarded to the guest, and
// streams the script's output lines; Wait collects them and the script's exit
// status. From the guest the host's 127.0.0.1 is 10.0.2.2; the guest is
// 10.0.2.15. See README.md beside this file.
package linuxvm
