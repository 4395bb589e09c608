#!/usr/bin/env bash
# build.sh CACHE_DIR - builds a small Debian-kernel VM that carries real Linux interop peers:
# soft-iWARP (siw, built here from Debian's linux-source for Debian's kernel, two variants),
# rdma-core (rping, ibv_devinfo, rdma), perftest (ib_*_bw/_lat), the kernel NBD client, and the
# kernel's NVMe/RDMA host and target (nvme-rdma, nvmet-rdma, with brd RAM disks) with nvme-cli and fio.
#
# Writes CACHE_DIR/{vmlinuz,initrd.gz,run-vm.sh,stamp}. Idempotent: when CACHE_DIR/stamp matches
# the inputs (kernel package version, host tool package versions, this script) it does nothing.
# Needs root for apt-get (Debian 12). See README.md beside this file.
# build.sh --check CACHE_DIR only tells: exit 0 if up to date, 1 if not (installs nothing).
set -euo pipefail
CHECK=; [ "${1:-}" = --check ] && { CHECK=1; shift; }
[ $# -eq 1 ] || { echo "usage: $0 [--check] CACHE_DIR" >&2; exit 2; }
[ -n "$CHECK" ] && [ ! -d "$1" ] && { echo "linuxvm-build: no $1" >&2; exit 1; }
mkdir -p "$1"; C=$(cd "$1" && pwd)
# Test binaries of several packages (go test runs them in parallel) may all
# ask for the VM at once: one builds, the others wait here, then find it up
# to date. (Two apt-gets at once would fail on dpkg's lock.)
if [ -z "$CHECK" ] && [ -z "${LINUXVM_LOCKED:-}" ]; then
  exec 9>"$C/.build.lock"
  flock 9
  export LINUXVM_LOCKED=1
fi
HERE=$(cd "$(dirname "$0")" && pwd)
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
log() { echo "linuxvm-build: $*" >&2; }
T0=$(date +%s)

# Host packages: tools copied into the initramfs, the siw build chain, and qemu to run it.
PKGS=(qemu-system-x86 busybox-static cpio kmod gcc make xz-utils rdma-core ibverbs-utils
      ibverbs-providers rdmacm-utils perftest iproute2 nbd-client e2fsprogs nvme-cli fio)
missing() { local p; for p in "$@"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"; done; }

# The kernel: whatever Debian's linux-image-amd64 points at now.
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=$(kpkg || true)
[ -n "$CHECK" ] && [ -z "$KPKG" ] && { log "no package lists (apt-get update)"; exit 1; }
if [ -z "$KPKG" ]; then log "apt-get update (no package lists)"; apt-get update -q >/dev/null; KPKG=$(kpkg); fi
V=${KPKG#linux-image-}                                  # e.g. 6.1.0-56-amd64
KVER=$(apt-cache show "$KPKG" | awk '/^Version:/{print $2; exit}')   # e.g. 6.1.192-2
SRCPKG="linux-source-${V%%.0-*}"                        # e.g. linux-source-6.1
PKGS+=("linux-headers-$V")

# Inputs that decide whether the cached VM is still right.
inputs() {
  echo "kernel $KPKG $KVER"
  (cd "$HERE" && sha256sum build.sh init.sh run-vm.sh)
  dpkg-query -W -f='${Package} ${Version}\n' "${PKGS[@]}" 2>/dev/null | sort
}
need=$(missing "${PKGS[@]}")
if [ -z "$need" ] && [ -s "$C/stamp" ] && [ -s "$C/vmlinuz" ] && [ -s "$C/initrd.gz" ] && [ -x "$C/run-vm.sh" ] \
   && [ "$(inputs)" = "$(cat "$C/stamp")" ]; then
  log "up to date ($C, kernel $V $KVER)"; exit 0
fi
[ -n "$CHECK" ] && { log "not up to date: $C (missing packages: $(echo $need))"; exit 1; }
if [ -n "$need" ]; then
  log "apt-get install $(echo $need)"
  apt-get install -y -q --no-install-recommends $need >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null; apt-get install -y -q --no-install-recommends $need >/dev/null; }
fi

W="$C/work"; D="$C/debs"; mkdir -p "$W" "$D"
# Debian packages we unpack ourselves (never installed): the kernel image and its source.
fetch_deb() { # $1 package, $2 version
  local f; f=$(ls "$D/${1}_${2/:/%3a}_"*.deb 2>/dev/null | head -1 || true)
  if [ -z "$f" ]; then
    rm -f "$D/${1}_"*.deb
    (cd "$D" && apt-get download -q "$1=$2" >/dev/null 2>&1)
    f=$(ls "$D/${1}_"*.deb | head -1)
  fi
  echo "$f"; }
KDEB=$(fetch_deb "$KPKG" "$KVER")
SDEB=$(fetch_deb "$SRCPKG" "$KVER")
log "kernel $KPKG $KVER, source $(basename "$SDEB")"

# Kernel image and modules (for modprobe --show-depends and the .ko files).
rm -rf "$W/k" && mkdir -p "$W/k" && dpkg-deb -x "$KDEB" "$W/k" &
# siw sources only, straight out of the compressed source tarball.
rm -rf "$W/src" && mkdir -p "$W/src"
dpkg-deb --fsys-tarfile "$SDEB" | tar -xO --wildcards './usr/src/linux-source-*.tar.xz' | xz -dc -T0 \
  | tar -x -C "$W/src" --strip-components=1 --wildcards '*/drivers/infiniband/sw/siw/*'
wait

# Two siw builds. The variant differs only in two compile-time constants of siw_main.c.
SIWSRC="$W/src/drivers/infiniband/sw/siw"
KB="/usr/src/linux-headers-$V"
build_siw() { # $1 output name, then sed expressions applied to siw_main.c
  local n=$1 b="$W/b_$1"; shift
  rm -rf "$b"; cp -r "$SIWSRC" "$b"
  local e; for e in "$@"; do sed -i "$e" "$b/siw_main.c"; done
  make -s -C "$KB" M="$b" CONFIG_RDMA_SIW=m modules >"$b/build.log" 2>&1 || { cat "$b/build.log" >&2; return 1; }
  strip --strip-debug -o "$W/$n.ko" "$b/siw.ko"; }
CRC1_SED=('s/^const bool mpa_crc_required;/const bool mpa_crc_required = true;/'
          's/^u_char mpa_version = MPA_REVISION_2;/u_char mpa_version = MPA_REVISION_1;/')
# Refuse to build a "crc1" that silently is the stock module if the source text ever changes.
for pat in '^const bool mpa_crc_required;' '^u_char mpa_version = MPA_REVISION_2;'; do
  grep -q "$pat" "$SIWSRC/siw_main.c" || { log "siw_main.c has no line matching '$pat': update CRC1_SED"; exit 1; }
done
build_siw siw & p1=$!
build_siw siw_crc1 "${CRC1_SED[@]}" & p2=$!
wait $p1; wait $p2
log "siw built ($(( $(date +%s) - T0 ))s)"

# The initramfs.
K="$W/k"; IR="$W/ir"
depmod -b "$K" "$V"
rm -rf "$IR" && mkdir -p "$IR"/{bin,sbin,proc,sys,dev,etc/libibverbs.d,tmp,mnt,host,run,root,var/run}
cp /bin/busybox "$IR/bin/"
for a in $(/bin/busybox --list); do [ -e "$IR/bin/$a" ] || ln -s busybox "$IR/bin/$a"; done
: > "$IR/modules.list"
MODS=(virtio_pci virtio_net 9pnet_virtio 9p nbd ext4 crc32c_generic libcrc32c ib_core iw_cm rdma_cm rdma_ucm ib_uverbs)
for m in "${MODS[@]}"; do modprobe -d "$K" -S "$V" --show-depends "$m"; done \
  | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r f; do
    rel=${f#"$K"/}; mkdir -p "$IR/$(dirname "$rel")"; cp "$f" "$IR/$rel"; echo "/$rel" >> "$IR/modules.list"; done
# Modules the guest loads itself when it needs them (modprobe, with the depmod'ed tree below):
# the NVMe/RDMA host and target, and brd RAM disks (modprobe brd rd_nr=1 rd_size=KiB) for the
# target's namespaces (configfs, where nvmet is configured, comes with them).
for m in nvme-rdma nvmet-rdma brd; do modprobe -d "$K" -S "$V" --show-depends "$m"; done \
  | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r f; do
    rel=${f#"$K"/}; [ -e "$IR/$rel" ] || { mkdir -p "$IR/$(dirname "$rel")"; cp "$f" "$IR/$rel"; }; done
mkdir -p "$IR/lib/modules/$V/extra"; cp "$W/siw.ko" "$W/siw_crc1.ko" "$IR/lib/modules/$V/extra/"
cp "$K/lib/modules/$V"/modules.{order,builtin,builtin.modinfo} "$IR/lib/modules/$V/"
depmod -b "$IR" "$V"
BINS=(/usr/sbin/nbd-client /sbin/mkfs.ext4 /sbin/e2fsck /sbin/tune2fs /sbin/dumpe2fs /usr/bin/rdma
      /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/rping /usr/bin/ucmatose /usr/bin/rdma_client /usr/bin/rdma_server
      /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_write_lat /usr/bin/ib_read_lat
      /usr/bin/ib_send_lat /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so /lib/x86_64-linux-gnu/libgcc_s.so.1
      /usr/sbin/nvme /usr/bin/fio)
for b in "${BINS[@]}"; do
  mkdir -p "$IR$(dirname "$b")"; cp -L "$b" "$IR$b"
  ldd "$b" 2>/dev/null | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'; done | sort -u | while read -r l; do
    mkdir -p "$IR$(dirname "$l")"; cp -L "$l" "$IR$l"; done
cp /etc/libibverbs.d/siw.driver "$IR/etc/libibverbs.d/"
echo "root:x:0:0:root:/root:/bin/sh" > "$IR/etc/passwd"; echo "root:x:0:" > "$IR/etc/group"
echo "127.0.0.1 localhost" > "$IR/etc/hosts"
cp "$HERE/init.sh" "$IR/init"; chmod +x "$IR/init"
(cd "$IR" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 > "$C/initrd.gz.tmp")
mv "$C/initrd.gz.tmp" "$C/initrd.gz"
cp "$K/boot/vmlinuz-$V" "$C/vmlinuz"
cp "$HERE/run-vm.sh" "$C/run-vm.sh"; chmod +x "$C/run-vm.sh"
rm -rf "$K" "$W/src" "$IR"                               # keep the two .ko files and the debs only
inputs > "$C/stamp"
log "built $C/{vmlinuz,initrd.gz,run-vm.sh} (kernel $V $KVER, siw variants: stock, crc1) in $(( $(date +%s) - T0 ))s"
