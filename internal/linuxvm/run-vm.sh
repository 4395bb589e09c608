#!/usr/bin/env bash
# run-vm.sh SHAREDIR [extra kernel args]  (build.sh copies this next to vmlinuz and initrd.gz)
# Boots the linuxvm guest under QEMU (software emulation). SHAREDIR is mounted at /host in the
# guest (9p) and SHAREDIR/guest.sh runs there; its output (and "RNICVM: ..." status lines, the last
# one "RNICVM: exit=N") is printed on standard output. The VM powers off when guest.sh ends.
# Environment:
#   RNICVM_SIW       stock (default: MPA rev 2 enhanced, CRC off) or crc1 (MPA rev 1, CRC required)
#   RNICVM_FORWARDS  ports P forwarded host 127.0.0.1:P -> guest 10.0.2.15:P (default "7002 ... 7009")
#   RNICVM_TIMEOUT   seconds before the VM is killed (default 300)
#   RNICVM_CONSOLE   file for the kernel console (default /dev/null)
#   RNICVM_PCAP      if set, a pcap file of everything the guest NIC sends and receives
#   RNICVM_MEM, RNICVM_SMP   guest memory in MiB (default 1024) and CPUs (default 2)
# From the guest the host's 127.0.0.1 is 10.0.2.2; the guest is 10.0.2.15.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SHAREDIR [kernel args]" >&2; exit 2; }
D=$(cd "$(dirname "$0")" && pwd)
SH=$(cd "$1" && pwd); shift
NET="user,id=n0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3"
for p in ${RNICVM_FORWARDS-7002 7003 7004 7005 7006 7007 7008 7009}; do
  NET="$NET,hostfwd=tcp:127.0.0.1:$p-10.0.2.15:$p"; done
DUMP=(); [ -n "${RNICVM_PCAP:-}" ] && DUMP=(-object "filter-dump,id=d0,netdev=n0,file=$RNICVM_PCAP")
exec timeout -s KILL "${RNICVM_TIMEOUT:-300}" qemu-system-x86_64 -accel tcg -cpu max \
  -smp "${RNICVM_SMP:-2}" -m "${RNICVM_MEM:-1024}" -no-reboot -display none -monitor none -nodefaults \
  -kernel "$D/vmlinuz" -initrd "$D/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet no_timer_check rnicvm.siw=${RNICVM_SIW:-stock} $*" \
  -serial "file:${RNICVM_CONSOLE:-/dev/null}" -serial stdio \
  -netdev "$NET" -device virtio-net-pci,netdev=n0 "${DUMP[@]}" \
  -virtfs "local,path=$SH,mount_tag=host,security_model=none,id=host0"
