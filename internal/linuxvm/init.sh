#!/bin/sh
# PID 1 of the linuxvm guest (copied to /init of the initramfs by build.sh).
# Kernel messages go to ttyS0 (the console); this script's status lines ("RNICVM: ...") and the
# output of /host/guest.sh go to ttyS1, which run-vm.sh connects to its standard output.
# Kernel arguments read here: rnicvm.siw=stock|crc1 (which siw build to load).
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /tmp
OUT=/dev/ttyS1
stty -F $OUT raw -echo 2>/dev/null
exec 3>$OUT
say() { echo "RNICVM: $*" >&3; }
finish() { say "exit=$1"; sync; poweroff -f; sleep 10; }

say "kernel $(uname -r) up $(cut -d' ' -f1 /proc/uptime)s"
for m in $(cat /modules.list); do insmod "$m" 2>/dev/null; done
VARIANT=stock
for a in $(cat /proc/cmdline); do case "$a" in rnicvm.siw=*) VARIANT=${a#rnicvm.siw=};; esac; done
case "$VARIANT" in
  stock) KO=siw;;
  crc1) KO=siw_crc1;;
  *) say "error: unknown rnicvm.siw=$VARIANT (want stock or crc1)"; finish 125;;
esac
if insmod "/lib/modules/$(uname -r)/extra/$KO.ko"; then say "siw loaded variant=$VARIANT module=$KO.ko"
else say "error: insmod $KO.ko failed"; finish 125; fi

ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 \
  || { say "error: eth0 setup failed"; finish 125; }
rdma link add siw0 type siw netdev eth0 || { say "error: rdma link add siw0 failed"; finish 125; }

mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host /host || { say "error: 9p mount of /host failed"; finish 125; }
[ -f /host/guest.sh ] || { say "error: /host/guest.sh missing"; finish 125; }
say "ready up $(cut -d' ' -f1 /proc/uptime)s"
cd /tmp
sh /host/guest.sh >&3 2>&1 </dev/null
finish $?
